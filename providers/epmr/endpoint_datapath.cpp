// Endpoint data path: msg, tagged and RMA operations. Every local descriptor is checked against
// the endpoint the operation is posted on before anything reaches tcp;ofi_rxm; RMA addresses and
// keys go down unchanged (epmr has the same offset-based addressing as the layer below). The
// user's context is passed through, so completions carry it back untouched.
#include "objects.hpp"

namespace epmr {
namespace {

Endpoint& ep_of(const fid_ep* ep) noexcept {
  return *owner_of<Endpoint>(ep);
}

ssize_t bad_desc(const char* op) noexcept {
  return refuse_desc(op);
}

// FI_EPMR_MAX_MSG_SIZE: a send, write or read longer than the reported max_msg_size.
inline bool too_long(size_t len) noexcept {
  const size_t limit = knobs().max_msg_size;
  return limit != 0 && len > limit;
}

[[gnu::cold]] ssize_t refuse_length(const char* op) noexcept {
  (void)op;
  return refuse("transfer longer than max_msg_size (FI_EPMR_MAX_MSG_SIZE)");
}

size_t total_length(const iovec* iov, size_t count) noexcept {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += iov[i].iov_len;
  return total;
}

// One local buffer. Without a descriptor only buffers the provider never touches in place are
// accepted: empty ones, and data that an inject copies before returning.
inline bool desc_ok(const Endpoint& ep, void* desc, size_t len, bool copied,
                    void*& inner) noexcept {
  if (desc == nullptr) {
    inner = nullptr;
    return len == 0 || copied;
  }
  return Mr::translate(desc, ep, inner);
}

// Descriptor arrays of vector and msg calls, translated on the stack.
class Descs {
 public:
  bool translate(const Endpoint& ep, const iovec* iov, void* const* desc, size_t count,
                 bool copied) noexcept {
    if (count > kMaxIov) return false;
    for (size_t i = 0; i < count; ++i) {
      if (!desc_ok(ep, desc != nullptr ? desc[i] : nullptr, iov[i].iov_len, copied, inner_[i]))
        return false;
    }
    return true;
  }
  void** data() noexcept { return inner_; }

 private:
  void* inner_[kMaxIov];
};

bool injected(uint64_t flags) noexcept {
  return (flags & FI_INJECT) != 0;
}

// ---- msg ----

ssize_t msg_recv(fid_ep* f, void* buf, size_t len, void* desc, fi_addr_t src, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_recv");
  if (const int fault = ep.recv_fault(ctx); fault != 0) return fault;
  // FI_EPMR_RX_CQ_DATA: a zero-length receive is a credit for remote CQ data.
  const ssize_t rc = len == 0 && ep.credit_cq() != nullptr
                         ? ep.credit_cq()->add_credit(ep, ctx)
                         : fi_recv(ep.inner(), buf, len, inner, src, ctx);
  if (rc == 0) ep.recv_posted(ctx);
  return rc;
}

ssize_t msg_recvv(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                  void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_recvv");
  return fi_recvv(ep.inner(), iov, inner.data(), count, src, ctx);
}

ssize_t msg_recvmsg(fid_ep* f, const fi_msg* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, false))
    return bad_desc("fi_recvmsg");
  fi_msg copy = *msg;
  copy.desc = inner.data();
  return fi_recvmsg(ep.inner(), &copy, flags);
}

ssize_t msg_send(fid_ep* f, const void* buf, size_t len, void* desc, fi_addr_t dest, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_send");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_send");
  return fi_send(ep.inner(), buf, len, inner, dest, ctx);
}

ssize_t msg_sendv(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                  void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(iov, count))) return refuse_length("fi_sendv");
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_sendv");
  return fi_sendv(ep.inner(), iov, inner.data(), count, dest, ctx);
}

ssize_t msg_sendmsg(fid_ep* f, const fi_msg* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(msg->msg_iov, msg->iov_count))) return refuse_length("fi_sendmsg");
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, injected(flags)))
    return bad_desc("fi_sendmsg");
  fi_msg copy = *msg;
  copy.desc = inner.data();
  return fi_sendmsg(ep.inner(), &copy, flags);
}

ssize_t msg_inject(fid_ep* f, const void* buf, size_t len, fi_addr_t dest) {
  return fi_inject(ep_of(f).inner(), buf, len, dest);
}

ssize_t msg_senddata(fid_ep* f, const void* buf, size_t len, void* desc, uint64_t data,
                     fi_addr_t dest, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_senddata");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_senddata");
  return fi_senddata(ep.inner(), buf, len, inner, data, dest, ctx);
}

ssize_t msg_injectdata(fid_ep* f, const void* buf, size_t len, uint64_t data, fi_addr_t dest) {
  return fi_injectdata(ep_of(f).inner(), buf, len, data, dest);
}

// ---- tagged ----

ssize_t tag_recv(fid_ep* f, void* buf, size_t len, void* desc, fi_addr_t src, uint64_t tag,
                 uint64_t ignore, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_trecv");
  return fi_trecv(ep.inner(), buf, len, inner, src, tag, ignore, ctx);
}

ssize_t tag_recvv(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                  uint64_t tag, uint64_t ignore, void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_trecvv");
  return fi_trecvv(ep.inner(), iov, inner.data(), count, src, tag, ignore, ctx);
}

ssize_t tag_recvmsg(fid_ep* f, const fi_msg_tagged* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, false))
    return bad_desc("fi_trecvmsg");
  fi_msg_tagged copy = *msg;
  copy.desc = inner.data();
  return fi_trecvmsg(ep.inner(), &copy, flags);
}

ssize_t tag_send(fid_ep* f, const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t tag,
                 void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_tsend");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_tsend");
  return fi_tsend(ep.inner(), buf, len, inner, dest, tag, ctx);
}

ssize_t tag_sendv(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                  uint64_t tag, void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(iov, count))) return refuse_length("fi_tsendv");
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_tsendv");
  return fi_tsendv(ep.inner(), iov, inner.data(), count, dest, tag, ctx);
}

ssize_t tag_sendmsg(fid_ep* f, const fi_msg_tagged* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(msg->msg_iov, msg->iov_count))) return refuse_length("fi_tsendmsg");
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, injected(flags)))
    return bad_desc("fi_tsendmsg");
  fi_msg_tagged copy = *msg;
  copy.desc = inner.data();
  return fi_tsendmsg(ep.inner(), &copy, flags);
}

ssize_t tag_inject(fid_ep* f, const void* buf, size_t len, fi_addr_t dest, uint64_t tag) {
  if (const int fault = ep_of(f).tinject_fault()) return fault;
  return fi_tinject(ep_of(f).inner(), buf, len, dest, tag);
}

ssize_t tag_senddata(fid_ep* f, const void* buf, size_t len, void* desc, uint64_t data,
                     fi_addr_t dest, uint64_t tag, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_tsenddata");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_tsenddata");
  return fi_tsenddata(ep.inner(), buf, len, inner, data, dest, tag, ctx);
}

ssize_t tag_injectdata(fid_ep* f, const void* buf, size_t len, uint64_t data, fi_addr_t dest,
                       uint64_t tag) {
  if (const int fault = ep_of(f).tinject_fault()) return fault;
  return fi_tinjectdata(ep_of(f).inner(), buf, len, data, dest, tag);
}

// ---- rma ----

ssize_t rma_read(fid_ep* f, void* buf, size_t len, void* desc, fi_addr_t src, uint64_t addr,
                 uint64_t key, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_read");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_read");
  return fi_read(ep.inner(), buf, len, inner, src, addr, key, ctx);
}

ssize_t rma_readv(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                  uint64_t addr, uint64_t key, void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(iov, count))) return refuse_length("fi_readv");
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_readv");
  return fi_readv(ep.inner(), iov, inner.data(), count, src, addr, key, ctx);
}

ssize_t rma_readmsg(fid_ep* f, const fi_msg_rma* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(msg->msg_iov, msg->iov_count))) return refuse_length("fi_readmsg");
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, false))
    return bad_desc("fi_readmsg");
  fi_msg_rma copy = *msg;
  copy.desc = inner.data();
  return fi_readmsg(ep.inner(), &copy, flags);
}

ssize_t rma_write(fid_ep* f, const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t addr,
                  uint64_t key, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_write");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_write");
  return fi_write(ep.inner(), buf, len, inner, dest, addr, key, ctx);
}

ssize_t rma_writev(fid_ep* f, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                   uint64_t addr, uint64_t key, void* ctx) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(iov, count))) return refuse_length("fi_writev");
  if (!inner.translate(ep, iov, desc, count, false)) return bad_desc("fi_writev");
  return fi_writev(ep.inner(), iov, inner.data(), count, dest, addr, key, ctx);
}

ssize_t rma_writemsg(fid_ep* f, const fi_msg_rma* msg, uint64_t flags) {
  Endpoint& ep = ep_of(f);
  Descs inner;
  if (too_long(total_length(msg->msg_iov, msg->iov_count))) return refuse_length("fi_writemsg");
  if (!inner.translate(ep, msg->msg_iov, msg->desc, msg->iov_count, injected(flags)))
    return bad_desc("fi_writemsg");
  fi_msg_rma copy = *msg;
  copy.desc = inner.data();
  return fi_writemsg(ep.inner(), &copy, flags);
}

ssize_t rma_inject(fid_ep* f, const void* buf, size_t len, fi_addr_t dest, uint64_t addr,
                   uint64_t key) {
  return fi_inject_write(ep_of(f).inner(), buf, len, dest, addr, key);
}

ssize_t rma_writedata(fid_ep* f, const void* buf, size_t len, void* desc, uint64_t data,
                      fi_addr_t dest, uint64_t addr, uint64_t key, void* ctx) {
  Endpoint& ep = ep_of(f);
  void* inner = nullptr;
  if (too_long(len)) return refuse_length("fi_writedata");
  if (!desc_ok(ep, desc, len, false, inner)) return bad_desc("fi_writedata");
  return fi_writedata(ep.inner(), buf, len, inner, data, dest, addr, key, ctx);
}

ssize_t rma_injectdata(fid_ep* f, const void* buf, size_t len, uint64_t data, fi_addr_t dest,
                       uint64_t addr, uint64_t key) {
  return fi_inject_writedata(ep_of(f).inner(), buf, len, data, dest, addr, key);
}

fi_ops_msg g_msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = msg_recv,
    .recvv = msg_recvv,
    .recvmsg = msg_recvmsg,
    .send = msg_send,
    .sendv = msg_sendv,
    .sendmsg = msg_sendmsg,
    .inject = msg_inject,
    .senddata = msg_senddata,
    .injectdata = msg_injectdata,
};

fi_ops_tagged g_tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = tag_recv,
    .recvv = tag_recvv,
    .recvmsg = tag_recvmsg,
    .send = tag_send,
    .sendv = tag_sendv,
    .sendmsg = tag_sendmsg,
    .inject = tag_inject,
    .senddata = tag_senddata,
    .injectdata = tag_injectdata,
};

fi_ops_rma g_rma_ops = {
    .size = sizeof(fi_ops_rma),
    .read = rma_read,
    .readv = rma_readv,
    .readmsg = rma_readmsg,
    .write = rma_write,
    .writev = rma_writev,
    .writemsg = rma_writemsg,
    .inject = rma_inject,
    .writedata = rma_writedata,
    .injectdata = rma_injectdata,
};

}  // namespace

fi_ops_msg* msg_ops() noexcept {
  return &g_msg_ops;
}
fi_ops_tagged* tagged_ops() noexcept {
  return &g_tagged_ops;
}
fi_ops_rma* rma_ops() noexcept {
  return &g_rma_ops;
}

}  // namespace epmr

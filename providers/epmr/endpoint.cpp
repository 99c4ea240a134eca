// Endpoint setup: open, bind, enable, options, names, close. The data path is in
// endpoint_datapath.cpp.
#include <algorithm>
#include <new>

#include "objects.hpp"

namespace epmr {
namespace {

Endpoint& endpoint_of(const fid* f) noexcept {
  return *owner_of<Endpoint>(f);
}

int ep_close(fid* f) {
  return endpoint_of(f).close();
}
int ep_bind(fid* f, fid* bfid, uint64_t flags) {
  return endpoint_of(f).bind(bfid, flags);
}
int ep_control(fid* f, int command, void* arg) {
  return endpoint_of(f).control(command, arg);
}

ssize_t ep_cancel(fid_t f, void* context) {
  return endpoint_of(f).cancel(context);
}

int ep_getopt(fid_t f, int level, int optname, void* optval, size_t* optlen) {
  return fi_getopt(&endpoint_of(f).inner()->fid, level, optname, optval, optlen);
}

int ep_setopt(fid_t f, int level, int optname, const void* optval, size_t optlen) {
  return fi_setopt(&endpoint_of(f).inner()->fid, level, optname, optval, optlen);
}

int ep_tx_ctx(fid_ep*, int, fi_tx_attr*, fid_ep**, void*) {
  return -FI_ENOSYS;
}
int ep_rx_ctx(fid_ep*, int, fi_rx_attr*, fid_ep**, void*) {
  return -FI_ENOSYS;
}

// Deprecated in libfabric, but still part of the table: forwarded through the inner table
// rather than the deprecated inline wrappers.
ssize_t ep_rx_size_left(fid_ep* ep) {
  fid_ep* inner = endpoint_of(&ep->fid).inner();
  return inner->ops->rx_size_left(inner);
}
ssize_t ep_tx_size_left(fid_ep* ep) {
  fid_ep* inner = endpoint_of(&ep->fid).inner();
  return inner->ops->tx_size_left(inner);
}

int cm_setname(fid_t f, void* addr, size_t addrlen) {
  return fi_setname(&endpoint_of(f).inner()->fid, addr, addrlen);
}

int cm_getname(fid_t f, void* addr, size_t* addrlen) {
  return fi_getname(&endpoint_of(f).inner()->fid, addr, addrlen);
}

int cm_getpeer(fid_ep* ep, void* addr, size_t* addrlen) {
  return fi_getpeer(endpoint_of(&ep->fid).inner(), addr, addrlen);
}

// Connection management belongs to connected endpoints; epmr only offers RDM.
int cm_connect(fid_ep*, const void*, const void*, size_t) {
  return -FI_ENOSYS;
}
int cm_listen(fid_pep*) {
  return -FI_ENOSYS;
}
int cm_accept(fid_ep*, const void*, size_t) {
  return -FI_ENOSYS;
}
int cm_reject(fid_pep*, fid_t, const void*, size_t) {
  return -FI_ENOSYS;
}
int cm_shutdown(fid_ep*, uint64_t) {
  return -FI_ENOSYS;
}
int cm_join(fid_ep*, const void*, uint64_t, fid_mc**, void*) {
  return -FI_ENOSYS;
}

fi_ops g_ep_fid_ops = {
    .size = sizeof(fi_ops),
    .close = ep_close,
    .bind = ep_bind,
    .control = ep_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_ep g_ep_ops = {
    .size = sizeof(fi_ops_ep),
    .cancel = ep_cancel,
    .getopt = ep_getopt,
    .setopt = ep_setopt,
    .tx_ctx = ep_tx_ctx,
    .rx_ctx = ep_rx_ctx,
    .rx_size_left = ep_rx_size_left,
    .tx_size_left = ep_tx_size_left,
};

fi_ops_cm g_cm_ops = {
    .size = sizeof(fi_ops_cm),
    .setname = cm_setname,
    .getname = cm_getname,
    .getpeer = cm_getpeer,
    .connect = cm_connect,
    .listen = cm_listen,
    .accept = cm_accept,
    .reject = cm_reject,
    .shutdown = cm_shutdown,
    .join = cm_join,
};

}  // namespace

Endpoint::Endpoint(Domain& domain, void* context) noexcept : handle_{}, domain_(&domain) {
  handle_.owner = this;
  fid_ep& ep = handle_.fid;
  ep.fid.fclass = FI_CLASS_EP;
  ep.fid.context = context;
  ep.fid.ops = &g_ep_fid_ops;
  ep.ops = &g_ep_ops;
  ep.cm = &g_cm_ops;
  ep.msg = msg_ops();
  ep.rma = rma_ops();
  ep.tagged = tagged_ops();
  // Atomics and collectives are not forwarded and never reported in caps.
  ep.atomic = nullptr;
  ep.collective = nullptr;
}

Endpoint* Endpoint::from_user(const fid* user) noexcept {
  if (user == nullptr || user->fclass != FI_CLASS_EP || user->ops != &g_ep_fid_ops) return nullptr;
  return owner_of<Endpoint>(user);
}

int Endpoint::open(Domain& domain, fi_info* info, fid_ep** out, void* context, uint64_t flags) {
  if (info == nullptr || out == nullptr) return -FI_EINVAL;
  std::unique_ptr<Endpoint> ep(new (std::nothrow) Endpoint(domain, context));
  if (!ep) return -FI_ENOMEM;
  const InfoPtr inner_info = to_inner_info(*info, domain.inner_view());
  if (!inner_info) return -FI_EINVAL;

  fid_ep* inner = nullptr;
  const int rc = flags != 0
                     ? fi_endpoint2(domain.inner(), inner_info.get(), &inner, flags, ep->user())
                     : fi_endpoint(domain.inner(), inner_info.get(), &inner, ep->user());
  if (rc != 0) return rc;
  ep->inner_.reset(inner);
  *out = &ep.release()->handle_.fid;
  return 0;
}

bool Endpoint::attach_mr() noexcept {
  const std::lock_guard lock(mutex_);
  if (closing_) return false;
  ++bound_mrs_;
  return true;
}

void Endpoint::detach_mr() noexcept {
  const std::lock_guard lock(mutex_);
  --bound_mrs_;
}

int Endpoint::close() noexcept {
  {
    const std::lock_guard lock(mutex_);
    // As cxi does: bound MRs hold a reference on their endpoint and must be closed first.
    if (bound_mrs_ != 0)
      return refuse("fi_close(ep): memory regions are still bound to it", -FI_EBUSY);
    closing_ = true;
  }
  if (credit_cq_ != nullptr) credit_cq_->drop_credits(*this);
  if (const int rc = close_inner(inner_); rc != 0) {
    const std::lock_guard lock(mutex_);
    closing_ = false;
    return rc;
  }
  delete this;
  return 0;
}

int Endpoint::bind(fid* bfid, uint64_t flags) noexcept {
  if (bfid == nullptr) return refuse("fi_ep_bind: no object");
  fid* inner = nullptr;
  const Domain* owner = domain_;
  switch (bfid->fclass) {
    case FI_CLASS_CQ:
      if (Cq* cq = Cq::from_user(bfid)) {
        inner = &cq->inner()->fid;
        owner = &cq->domain();
        if ((flags & FI_RECV) != 0 && cq->emulates_rx_cq_data()) credit_cq_ = cq;
      }
      break;
    case FI_CLASS_AV:
      if (const Av* av = Av::from_user(bfid)) {
        inner = &av->inner()->fid;
        owner = &av->domain();
      }
      break;
    case FI_CLASS_CNTR:
      if (const Cntr* cntr = Cntr::from_user(bfid)) {
        inner = &cntr->inner()->fid;
        owner = &cntr->domain();
      }
      break;
    case FI_CLASS_EQ:
      if (const Eq* eq = Eq::from_user(bfid)) inner = &eq->inner()->fid;
      break;
    default:
      break;
  }
  if (inner == nullptr) return refuse("fi_ep_bind: not an epmr CQ, AV, counter or EQ");
  if (owner != domain_) return refuse("fi_ep_bind: object belongs to another domain");
  return fi_ep_bind(inner_.get(), inner, flags);
}

int Endpoint::cancel(void* context) noexcept {
  const Knobs& k = knobs();
  if (k.fail_recv_after != 0 || k.fail_recv_every != 0) {
    const std::lock_guard lock(mutex_);
    if (std::find(refused_.begin(), refused_.end(), context) != refused_.end()) {
      return refuse("fi_cancel: a receive that was refused, so never posted", -FI_ENOENT);
    }
  }
  // A credit taken back generates no completion (unlike a real provider's FI_ECANCELED).
  if (credit_cq_ != nullptr && credit_cq_->remove_credit(*this, context)) return 0;
  return static_cast<int>(fi_cancel(&inner_->fid, context));
}

int Endpoint::recv_fault(void* context) noexcept {
  const Knobs& k = knobs();
  if (k.fail_recv_after == 0 && k.fail_recv_every == 0) return 0;
  const std::lock_guard lock(mutex_);
  try {
    int code = 0;
    if (k.fail_recv_after != 0 && recvs_++ >= k.fail_recv_after) code = -FI_EIO;
    if (code == 0 && k.fail_recv_every != 0 && !posted_.insert(context).second &&
        ++reposts_ % k.fail_recv_every == 0) {
      code = -FI_EAGAIN;
    }
    if (code == 0) return 0;
    if (std::find(refused_.begin(), refused_.end(), context) == refused_.end()) {
      refused_.push_back(context);
    }
    return refuse(
        code == -FI_EIO ? "fi_recv: FI_EPMR_FAIL_RECV_AFTER" : "fi_recv: FI_EPMR_FAIL_RECV_EVERY",
        code);
  } catch (const std::bad_alloc&) {
    return -FI_ENOMEM;
  }
}

int Endpoint::tinject_fault() noexcept {
  const size_t every = knobs().fail_tinject_every;
  if (every == 0 || (tinjects_.fetch_add(1, std::memory_order_relaxed) + 1) % every != 0) return 0;
  return refuse("fi_tinject: FI_EPMR_FAIL_TINJECT_EVERY", -FI_EAGAIN);
}

void Endpoint::recv_posted(void* context) noexcept {
  const Knobs& k = knobs();
  if (k.fail_recv_after == 0 && k.fail_recv_every == 0) return;
  const std::lock_guard lock(mutex_);
  refused_.erase(std::remove(refused_.begin(), refused_.end(), context), refused_.end());
}

int Endpoint::control(int command, void* arg) noexcept {
  switch (command) {
    case FI_ENABLE: {
      const int rc = fi_enable(inner_.get());
      if (rc == 0) enabled_.store(true, std::memory_order_release);
      return rc;
    }
    case FI_ALIAS:
      // An alias would be a second user-visible fid for one endpoint; MR binding by identity
      // could not tell them apart.
      return refuse("fi_control(FI_ALIAS) is not supported", -FI_ENOSYS);
    default:
      return fi_control(&inner_->fid, command, arg);
  }
}

}  // namespace epmr

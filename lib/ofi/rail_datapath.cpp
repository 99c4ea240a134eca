// Rail data path: posting operations and reading completions. No allocation, no lock of ours,
// no logging above trace on success; failures are logged once here, where they are decided.
#include <algorithm>
#include <cstdlib>

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "ofi/error.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail.hpp"
#include "util/log.hpp"
#include "util/step_trace.hpp"

namespace loom::ofi {

Status Rail::post_failed(const char* call, long rc) {
  // A full queue is back-pressure: the caller posts again after progress. shm (libfabric 1.17)
  // says so with -FI_ENOMEM when its receive entries (as many as the rail's rx depth) are all
  // posted, where rxm says -FI_EAGAIN; loom's API allows more receives on one rail at once
  // (128 requests of 8 buffers on one communicator) than that depth.
  if (rc == -FI_EAGAIN || rc == -FI_ENOMEM) return Status::kRetry;
  last_error_ = std::string(call) + " on " + describe() + ": " + fi_error_text(rc);
  // A post retried at every poll (a control receive being reposted) may fail every time.
  if (post_errors_.admit()) util::log().error("{}{}", last_error_, post_errors_.suffix());
  return Status::kError;
}

Status Rail::send(Address peer, const void* buffer, std::size_t length, void* desc, OpContext* op) {
  const util::StepSpan step(util::Step::kSendBegin, util::Step::kSendEnd);
  long rc = fi_send(endpoint_.get(), buffer, length, desc, peer, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_send", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::inject(Address peer, const void* buffer, std::size_t length) {
  const util::StepSpan step(util::Step::kSendBegin, util::Step::kSendEnd);
  long rc = fi_inject(endpoint_.get(), buffer, length, peer);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_inject", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::recv(void* buffer, std::size_t length, void* desc, OpContext* op) {
  const util::StepSpan step(util::Step::kRecvPostBegin, util::Step::kRecvPostEnd);
  long rc = fi_recv(endpoint_.get(), buffer, length, desc, FI_ADDR_UNSPEC, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_recv", rc);
  return Status::kOk;
}

Status Rail::tagged_send(Address peer, const void* buffer, std::size_t length, void* desc,
                         std::uint64_t tag, std::uint32_t data, OpContext* op) {
  const util::StepSpan step(util::Step::kSendBegin, util::Step::kSendEnd);
  long rc = fi_tsenddata(endpoint_.get(), buffer, length, desc, data, peer, tag, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_tsenddata", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::tagged_inject(Address peer, const void* buffer, std::size_t length, std::uint64_t tag,
                           std::uint32_t data) {
  const util::StepSpan step(util::Step::kSendBegin, util::Step::kSendEnd);
  long rc = fi_tinjectdata(endpoint_.get(), buffer, length, data, peer, tag);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_tinjectdata", rc);
  stats_.bytes_sent += length;
  return Status::kOk;
}

Status Rail::tagged_recv(void* buffer, std::size_t length, void* desc, std::uint64_t tag,
                         std::uint64_t ignore, OpContext* op) {
  const util::StepSpan step(util::Step::kRecvPostBegin, util::Step::kRecvPostEnd);
  long rc = fi_trecv(endpoint_.get(), buffer, length, desc, FI_ADDR_UNSPEC, tag, ignore, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_trecv", rc);
  return Status::kOk;
}

Status Rail::write(Address peer, const void* buffer, std::size_t length, void* desc,
                   std::uint64_t remote_address, std::uint64_t key, std::uint32_t data,
                   OpContext* op) {
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc =
      fi_writedata(endpoint_.get(), buffer, length, desc, data, peer, remote_address, key, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_writedata", rc);
  stats_.bytes_written += length;
  return Status::kOk;
}

Status Rail::write(Address peer, const void* buffer, std::size_t length, void* desc,
                   std::uint64_t remote_address, std::uint64_t key, OpContext* op) {
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc = fi_write(endpoint_.get(), buffer, length, desc, peer, remote_address, key, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_write", rc);
  stats_.bytes_written += length;
  return Status::kOk;
}

namespace {
// One contiguous block each side: what fi_writemsg and fi_readmsg take, pointing into `iov`,
// `remote` and `desc`, which must outlive the call.
fi_msg_rma one_block(iovec& iov, fi_rma_iov& remote, void*& desc, Address peer, OpContext* op,
                     std::uint64_t data) noexcept {
  return fi_msg_rma{.msg_iov = &iov,
                    .desc = &desc,
                    .iov_count = 1,
                    .addr = peer,
                    .rma_iov = &remote,
                    .rma_iov_count = 1,
                    .context = op,
                    .data = data};
}
}  // namespace

Status Rail::write(Address peer, const void* buffer, std::size_t length, void* desc,
                   std::uint64_t remote_address, std::uint64_t key, RmaPost how, OpContext* op) {
  iovec iov{const_cast<void*>(buffer), length};
  fi_rma_iov remote{remote_address, length, key};
  const fi_msg_rma msg = one_block(iov, remote, desc, peer, op, how.data);
  const std::uint64_t flags = FI_COMPLETION | (how.more ? FI_MORE : 0) |
                              (how.delivery_complete ? FI_DELIVERY_COMPLETE : 0) |
                              (how.remote_cq_data ? FI_REMOTE_CQ_DATA : 0);
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc = fi_writemsg(endpoint_.get(), &msg, flags);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_writemsg", rc);
  stats_.bytes_written += length;
  return Status::kOk;
}

Status Rail::read(Address peer, void* buffer, std::size_t length, void* desc,
                  std::uint64_t remote_address, std::uint64_t key, RmaPost how, OpContext* op) {
  iovec iov{buffer, length};
  fi_rma_iov remote{remote_address, length, key};
  const fi_msg_rma msg = one_block(iov, remote, desc, peer, op, 0);
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc = fi_readmsg(endpoint_.get(), &msg, FI_COMPLETION | (how.more ? FI_MORE : 0));
  if (rc != 0) [[unlikely]]
    return post_failed("fi_readmsg", rc);
  stats_.bytes_read += length;
  return Status::kOk;
}

Status Rail::inject_write(Address peer, const void* buffer, std::size_t length,
                          std::uint64_t remote_address, std::uint64_t key, std::uint32_t data) {
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc = fi_inject_writedata(endpoint_.get(), buffer, length, data, peer, remote_address, key);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_inject_writedata", rc);
  stats_.bytes_written += length;
  return Status::kOk;
}

Status Rail::read(Address peer, void* buffer, std::size_t length, void* desc,
                  std::uint64_t remote_address, std::uint64_t key, OpContext* op) {
  const util::StepSpan step(util::Step::kWriteBegin, util::Step::kWriteEnd);
  long rc = fi_read(endpoint_.get(), buffer, length, desc, peer, remote_address, key, op);
  if (rc != 0) [[unlikely]]
    return post_failed("fi_read", rc);
  stats_.bytes_read += length;
  return Status::kOk;
}

Status Rail::flush(const MemoryRegistration& registration, const void* address, std::size_t length,
                   OpContext* op) {
  length = std::min(length, FlushBuffer::kBytes);
  if (!registration.covers_rail(index_) || !registration.contains(address, length)) {
    last_error_ = "flush on " + describe() + ": the buffer is not registered on this rail";
    return Status::kInvalid;
  }
  return read(self_, flush_->data(), length, flush_->registration().desc(index_),
              registration.remote_address(address), registration.key(index_), op);
}

// The remote write's CQ data goes to the CQ's RemoteWriteHandler; the receive only comes back.
void RxCqDataReceives::on_completion(OpContext& receive, const Completion& completion) {
  if (completion.status == Status::kCancelled) return;  // the rail is closing
  if (completion.status != Status::kOk && errors_.admit()) {
    util::log().error("receive for remote CQ data failed, posted again: {}{}",
                      completion.error_text, errors_.suffix());
  }
  repost(receive);
}

// Remote writes stall once no receive is posted, so a refused one must come back.
void RxCqDataReceives::repost(OpContext& receive) {
  if (rail_->recv(nullptr, 0, nullptr, &receive) == Status::kOk) [[likely]]
    return;
  waiting_.push_back(&receive);  // capacity reserved for every receive
}

bool RxCqDataReceives::retry_waiting() {
  while (!waiting_.empty()) {
    if (rail_->recv(nullptr, 0, nullptr, waiting_.back()) != Status::kOk) return false;
    waiting_.pop_back();
  }
  return true;
}

Status Rail::cancel(OpContext* op) noexcept {
  const long rc = fi_cancel(&endpoint_->fid, op);
  if (rc == 0) [[likely]]
    return Status::kOk;
  if (rc == -FI_ENOENT) return Status::kInvalid;
  return post_failed("fi_cancel", rc);
}

}  // namespace loom::ofi

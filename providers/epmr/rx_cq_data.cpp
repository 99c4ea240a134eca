// FI_EPMR_RX_CQ_DATA: epmr requires FI_RX_CQ_DATA mode, as efa and verbs do, where remote CQ
// data consumes a posted receive. tcp;ofi_rxm reports remote writes without one, so epmr keeps
// the zero-length untagged receives posted on an endpoint as credits in the CQ it receives
// into, and hands out a remote write with CQ data only together with a credit's context. With
// no credit posted the write waits in the CQ (as an RDMA NIC would not complete it) and the
// entries behind it that need a credit wait too; other entries go on. Applies to fi_cq_read
// and fi_cq_readfrom (not the blocking sread calls). A cancelled credit completes with nothing.
#include <algorithm>
#include <cstring>

#include "objects.hpp"

namespace epmr {
namespace {

constexpr size_t kScratchEntries = 64;

bool consumes_credit(const fi_cq_tagged_entry& entry) noexcept {
  return (entry.flags & FI_REMOTE_WRITE) != 0 && (entry.flags & FI_REMOTE_CQ_DATA) != 0;
}

}  // namespace

size_t rx_cq_data_entry_size(fi_cq_format format) noexcept {
  switch (format) {
    case FI_CQ_FORMAT_MSG:
      return sizeof(fi_cq_msg_entry);
    case FI_CQ_FORMAT_DATA:
      return sizeof(fi_cq_data_entry);
    case FI_CQ_FORMAT_TAGGED:
      return sizeof(fi_cq_tagged_entry);
    default:
      return 0;
  }
}

int Cq::add_credit(const Endpoint& ep, void* context) noexcept {
  const std::lock_guard lock(credits_mutex_);
  try {
    credits_.push_back(Credit{&ep, context});
  } catch (const std::bad_alloc&) {
    return -FI_ENOMEM;
  }
  return 0;
}

bool Cq::remove_credit(const Endpoint& ep, void* context) noexcept {
  const std::lock_guard lock(credits_mutex_);
  auto it = std::find_if(credits_.begin(), credits_.end(),
                         [&](const Credit& c) { return c.ep == &ep && c.context == context; });
  if (it == credits_.end()) return false;
  credits_.erase(it);
  return true;
}

void Cq::drop_credits(const Endpoint& ep) noexcept {
  const std::lock_guard lock(credits_mutex_);
  credits_.erase(std::remove_if(credits_.begin(), credits_.end(),
                                [&](const Credit& c) { return c.ep == &ep; }),
                 credits_.end());
}

// Entries are copied through a fi_cq_tagged_entry, whose layout begins with every smaller
// format's; only the first entry_size_ bytes are meaningful.
ssize_t Cq::read(void* buf, size_t count, fi_addr_t* src) noexcept {
  auto* out = static_cast<char*>(buf);
  size_t done = 0;
  auto deliver = [&](const fi_cq_tagged_entry& entry, fi_addr_t from) {
    std::memcpy(out + done * entry_size_, &entry, entry_size_);
    if (src != nullptr) src[done] = from;
    ++done;
  };
  const std::lock_guard lock(credits_mutex_);
  while (done < count && !held_.empty() && !credits_.empty()) {
    Held held = held_.front();
    held_.pop_front();
    held.entry.op_context = credits_.front().context;
    credits_.pop_front();
    deliver(held.entry, held.src);
  }
  if (done == count) return static_cast<ssize_t>(done);

  alignas(fi_cq_tagged_entry) char scratch[kScratchEntries * sizeof(fi_cq_tagged_entry)];
  fi_addr_t from[kScratchEntries];
  const size_t want = std::min(count - done, kScratchEntries);
  const ssize_t read = src != nullptr ? fi_cq_readfrom(inner_.get(), scratch, want, from)
                                      : fi_cq_read(inner_.get(), scratch, want);
  if (read < 0) return done > 0 ? static_cast<ssize_t>(done) : read;
  for (ssize_t i = 0; i < read; ++i) {
    fi_cq_tagged_entry entry{};
    std::memcpy(&entry, scratch + static_cast<size_t>(i) * entry_size_, entry_size_);
    const fi_addr_t origin = src != nullptr ? from[i] : FI_ADDR_NOTAVAIL;
    if (consumes_credit(entry)) {
      if (!held_.empty() || credits_.empty()) {
        held_.push_back(Held{entry, origin});  // std::bad_alloc here ends a test run: fine
        continue;
      }
      entry.op_context = credits_.front().context;
      credits_.pop_front();
    }
    deliver(entry, origin);
  }
  return done > 0 ? static_cast<ssize_t>(done) : -FI_EAGAIN;
}

}  // namespace epmr

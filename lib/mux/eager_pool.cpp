#include "mux/eager_pool.hpp"

#include <algorithm>

#include "ofi/memory_registration.hpp"
#include "ofi/rail_set.hpp"
#include "util/log.hpp"

namespace loom::mux {

EagerPool::EagerPool(ofi::RailSet& rails, std::size_t count, std::size_t buffer_size,
                     EagerArrivalSink& sink, std::chrono::milliseconds promise_timeout)
    : rails_(&rails),
      sink_(&sink),
      buffer_size_(buffer_size),
      promise_timeout_(promise_timeout),
      memory_(std::make_unique_for_overwrite<std::byte[]>(count * buffer_size)),
      slots_(count) {
  registration_ =
      &rails.registration_table().acquire(memory_.get(), count * buffer_size, MemoryType::kHost, 0);
  reposts_.reserve(count);
  idle_.reserve(count);
  for (Slot& slot : slots_) slot.op.handler = this;
  // Posted as promises need them (promise()), the first ones used first.
  for (std::uint32_t i = static_cast<std::uint32_t>(count); i-- > 0;) idle_.push_back(i);
}

// Posted receives point into memory_: cancel them so no completion can name a buffer after
// this. The lane's endpoints close right after, which drops them for good.
EagerPool::~EagerPool() {
  for (Slot& slot : slots_) {
    if (slot.posted) static_cast<void>(rails_->data(0).cancel(&slot.op));
  }
  rails_->registration_table().release(*registration_);
}

bool EagerPool::post(std::uint32_t buffer) {
  ofi::Rail& rail = rails_->data(0);
  // Any communicator's message: the comm id and the sequence field are ignored.
  const Status status = rail.tagged_recv(
      memory_.get() + std::size_t{buffer} * buffer_size_, buffer_size_, registration_->desc(0),
      encode_tag({TagKind::kEager, 0, 0}), kTagCommAndSeqMask, &slots_[buffer].op);
  if (status != Status::kOk) {
    if (status != Status::kRetry) {
      util::log().warn("eager buffer not posted on {}: {}", rail.describe(), rail.last_error());
    }
    return false;
  }
  slots_[buffer].posted = true;
  ++posted_;
  return true;
}

std::size_t EagerPool::promise(std::size_t wanted, std::size_t held, std::size_t comms) noexcept {
  const std::size_t share = std::max(slots_.size() / std::max<std::size_t>(comms, 1), kMinShare);
  const std::size_t room = share > held ? share - held : 0;
  const std::size_t credits = std::min(wanted, room);
  // The idle buffers used last are posted first: still in cache.
  while (posted_ < promised_ + credits && !idle_.empty() && post(idle_.back())) idle_.pop_back();
  const std::size_t backed = std::min(credits, posted_ > promised_ ? posted_ - promised_ : 0);
  promised_ += backed;
  most_promised_ = std::max(most_promised_, promised_);
  return backed;
}

void EagerPool::forget(std::size_t credits) {
  if (credits == 0) return;
  forgotten_.push_back({credits, std::chrono::steady_clock::now() + promise_timeout_});
}

bool EagerPool::take_back() {
  const std::size_t waiting = reposts_.size();
  while (!reposts_.empty()) {
    // Posted again up to the most ever promised at once: credits are topped up in bulk, and
    // the buffers for them are then posted already, one per message as they come back, not
    // all at the top-up (on a message's path). The rest stay idle until a promise needs them.
    if (posted_ >= most_promised_) {
      idle_.push_back(reposts_.back());
    } else if (!post(reposts_.back())) {
      break;
    }
    reposts_.pop_back();
  }
  const bool taken = reposts_.size() != waiting;
  if (forgotten_.empty()) [[likely]]
    return taken;
  const auto now = std::chrono::steady_clock::now();
  const std::size_t before = forgotten_.size();
  std::erase_if(forgotten_, [&](const Forgotten& f) {
    if (now < f.until) return false;
    promised_ -= std::min(promised_, f.credits);
    return true;
  });
  return taken || forgotten_.size() != before;
}

void EagerPool::on_completion(ofi::OpContext& op, const ofi::Completion& completion) {
  const std::uint32_t buffer = index_of(op);
  slots_[buffer].posted = false;
  --posted_;
  if (completion.status == Status::kCancelled) return;  // closing
  // A message spent a credit the sender could only have had from this pool: its
  // communicator's, or one forgotten at a close. Counted before the communicator sees it: the
  // delivery may promise credits again, and must not post a buffer for the spent one.
  const bool spent = completion.status == Status::kOk || completion.status == Status::kTruncated;
  const bool counted = spent && promised_ != 0;
  if (counted) --promised_;
  const bool attached = sink_->on_eager_arrival(EagerArrival{.buffer = buffer,
                                                             .status = completion.status,
                                                             .length = completion.length,
                                                             .overflow = completion.overflow,
                                                             .tag = decode_tag(completion.tag),
                                                             .has_data = completion.has_data,
                                                             .data = completion.data,
                                                             .error_text = completion.error_text});
  if (!spent || attached) return;
  // No communicator took it (none was called): a forgotten credit, or none of ours.
  if (forgotten_.empty()) {
    if (counted) ++promised_;
    return;
  }
  if (--forgotten_.front().credits == 0) forgotten_.erase(forgotten_.begin());
}

}  // namespace loom::mux

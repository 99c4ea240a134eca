// Streams of one-sided batches between two processes, for tests that check every byte the moment
// a notification is seen. Both ends derive batch n's layout from the stream's seed and n alone
// (plan_batch), and place it with the same ring arithmetic, so nothing but notifications and the
// target's progress reports (how many batches it checked: the space the initiator may reuse)
// has to travel between them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/rma.hpp"
#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {

using Clock = std::chrono::steady_clock;

// splitmix64: cheap to seed per batch, the same on both ends.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }

 private:
  std::uint64_t state_;
};

// How batches of a stream look: 1..max_blocks blocks of 1..small_max bytes, one in
// `large_one_in` of up to large_max instead (0: none), with gaps of up to max_gap bytes.
struct Shape {
  std::size_t max_blocks = 16;
  std::size_t small_max = 16 << 10;
  std::size_t large_max = 0;
  unsigned large_one_in = 0;
  std::size_t max_gap = 64;
};

// A block's place in its batch's local and remote extents, and the pattern it carries.
struct PlannedBlock {
  std::size_t local = 0;
  std::size_t remote = 0;
  std::size_t length = 0;
  std::uint64_t seed = 0;
};

struct PlannedBatch {
  std::vector<PlannedBlock> blocks;
  std::size_t local_extent = 0;
  std::size_t remote_extent = 0;
  std::uint64_t bytes = 0;
};

// Batch n of stream `stream`: blocks of random sizes at disjoint random places, laid out in one
// random order in the remote extent and in another in the local one, each with its own pattern.
inline PlannedBatch plan_batch(std::uint64_t stream, std::uint64_t n, const Shape& shape) {
  Rng rng(stream * 0xD1B54A32D192ED03ull ^ (n + 1) * 0x9E3779B97F4A7C15ull);
  PlannedBatch batch;
  batch.blocks.resize(1 + rng.below(shape.max_blocks));
  for (std::size_t i = 0; i < batch.blocks.size(); ++i) {
    PlannedBlock& block = batch.blocks[i];
    const bool large = shape.large_one_in != 0 && rng.below(shape.large_one_in) == 0;
    block.length = 1 + rng.below(large ? shape.large_max : shape.small_max);
    block.seed = (stream << 40) + n * 64 + i;
    batch.bytes += block.length;
  }
  std::vector<std::size_t> order(batch.blocks.size());
  auto lay_out = [&](std::size_t PlannedBlock::*place) {
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    std::size_t cursor = rng.below(shape.max_gap + 1);
    for (std::size_t i : order) {
      batch.blocks[i].*place = cursor;
      cursor += batch.blocks[i].length + rng.below(shape.max_gap + 1);
    }
    return cursor;
  };
  batch.remote_extent = lay_out(&PlannedBlock::remote);
  batch.local_extent = lay_out(&PlannedBlock::local);
  return batch;
}

// Extents placed one after the other, back to 0 where the next would pass the end.
class Ring {
 public:
  explicit Ring(std::size_t size) : size_(size) {}
  std::size_t place(std::size_t extent) {
    require(extent <= size_, "a batch larger than its ring");
    if (next_ + extent > size_) next_ = 0;
    const std::size_t at = next_;
    next_ += extent;
    return at;
  }

 private:
  std::size_t size_;
  std::size_t next_ = 0;
};

inline bool overlap(std::size_t a, std::size_t a_length, std::size_t b, std::size_t b_length) {
  return a < b + b_length && b < a + a_length;
}

inline std::string status_text(Status status) {
  return std::string(to_string(status));
}

// The target's side of a write stream: each notification must be the next one, and every byte
// of its batch must be in `window` (the stream's part of the target's region) when it is seen.
class NotificationCheck {
 public:
  NotificationCheck(std::span<const std::byte> window, std::uint64_t stream, Shape shape,
                    std::uint64_t tag)
      : window_(window), stream_(stream), shape_(shape), tag_(tag), ring_(window.size()) {}

  void check(const Notification& notification) {
    // The texts are built only for a failure: this runs for every notification.
    auto what = [&] {
      return "stream " + std::to_string(stream_) + " notification " + std::to_string(seen_) +
             " (value " + std::to_string(notification.value) + ")";
    };
    if (notification.value != seen_)
      throw Failure(what() + ": not the next one in post order (lost, duplicated or reordered)");
    const PlannedBatch batch = plan_batch(stream_, seen_, shape_);
    const std::size_t at = ring_.place(batch.remote_extent);
    if (notification.tag != tag_) throw Failure(what() + ": wrong tag");
    if (notification.blocks != batch.blocks.size() || notification.bytes != batch.bytes) {
      throw Failure(what() + ": " + std::to_string(notification.blocks) + " blocks, " +
                    std::to_string(notification.bytes) + " bytes, expected " +
                    std::to_string(batch.blocks.size()) + ", " + std::to_string(batch.bytes));
    }
    for (std::size_t i = 0; i < batch.blocks.size(); ++i) {
      const PlannedBlock& block = batch.blocks[i];
      const std::string wrong =
          check_pattern(window_.subspan(at + block.remote, block.length), block.seed);
      if (!wrong.empty()) {
        throw Failure(what() + ": seen before block " + std::to_string(i) +
                      " landed whole: " + wrong);
      }
    }
    ++seen_;
    last_ = Clock::now();
  }
  [[nodiscard]] std::uint64_t seen() const noexcept { return seen_; }
  [[nodiscard]] Clock::time_point last() const noexcept { return last_; }

 private:
  std::span<const std::byte> window_;
  std::uint64_t stream_;
  Shape shape_;
  std::uint64_t tag_;
  Ring ring_;
  std::uint64_t seen_ = 0;
  Clock::time_point last_ = Clock::now();
};

// One batch as the initiator saw it.
struct BatchRecord {
  Request request;
  Status status = Status::kInProgress;
  Clock::time_point posted;
  Clock::time_point ended;
  std::size_t local_at = 0;
  std::size_t local_extent = 0;
  std::size_t remote_at = 0;
  std::size_t remote_extent = 0;
  std::string error;  // last_error() when it failed
};

// The initiator's side: notified write batches (value = the batch's number) into `remote`, from
// `local_bytes` (the part of a context region `local` starting at `local_offset`), at most
// `window` in flight, never into space whose batch the target has not checked (checked()).
class WriteStream {
 public:
  struct Setup {
    RmaInitiator* rma = nullptr;
    MemoryRegion local;
    std::span<std::byte> local_bytes;
    std::size_t local_offset = 0;
    RemoteRegion remote;
    std::size_t remote_offset = 0;
    std::size_t remote_size = 0;
    std::uint64_t stream = 0;
    Shape shape;
    std::uint64_t tag = 0;
    std::uint64_t limit = 0;  // batches in all
    std::size_t window = 32;
    bool test_all = false;  // test every batch in flight, not only up to the oldest running
  };

  explicit WriteStream(const Setup& setup)
      : s_(setup), local_ring_(setup.local_bytes.size()), remote_ring_(setup.remote_size) {
    records_.reserve(setup.limit);
  }

  // Posts what the window, the limit and the target's progress allow. kOk, or the status of a
  // post that was refused (the stream posts nothing more then).
  Status post() {
    while (!refused_ && records_.size() < s_.limit && in_flight() < s_.window) {
      const std::uint64_t n = records_.size();
      if (!staged_) {
        staged_ = plan_batch(s_.stream, n, s_.shape);
        staged_at_ = {local_ring_.place(staged_->local_extent),
                      remote_ring_.place(staged_->remote_extent)};
      }
      for (std::uint64_t k = checked_; k < n; ++k) {
        const BatchRecord& r = records_[k];
        if (overlap(staged_at_.first, staged_->local_extent, r.local_at, r.local_extent) ||
            overlap(staged_at_.second, staged_->remote_extent, r.remote_at, r.remote_extent))
          return Status::kOk;  // wait for the target to check batch k
      }
      blocks_.clear();
      for (const PlannedBlock& block : staged_->blocks) {
        fill_pattern(s_.local_bytes.subspan(staged_at_.first + block.local, block.length),
                     block.seed);
        blocks_.push_back({.local = s_.local,
                           .local_offset = s_.local_offset + staged_at_.first + block.local,
                           .remote = s_.remote,
                           .remote_offset = s_.remote_offset + staged_at_.second + block.remote,
                           .length = block.length});
      }
      BatchRecord record{.posted = Clock::now(),
                         .local_at = staged_at_.first,
                         .local_extent = staged_->local_extent,
                         .remote_at = staged_at_.second,
                         .remote_extent = staged_->remote_extent};
      const Status status = post_into(
          s_.rma->write(blocks_, Notification{.tag = s_.tag, .value = n}), record.request);
      if (status == Status::kRetry) return Status::kOk;
      if (status != Status::kOk) {
        refused_ = status;
        refused_at_ = record.posted;
        refusal_ = s_.rma->last_error();
        return status;
      }
      records_.push_back(record);
      staged_.reset();
    }
    return Status::kOk;
  }

  // Tests the batches in flight, oldest first (all of them with test_all, else up to the first
  // one still running). Requires every outcome to be in `allowed`.
  void test() {
    for (std::size_t k = first_open_; k < records_.size(); ++k) {
      BatchRecord& r = records_[k];
      if (r.status != Status::kInProgress) continue;
      const Status status = s_.rma->test(r.request);
      if (status == Status::kInProgress) {
        if (!s_.test_all) break;
        continue;
      }
      r.status = status;
      r.ended = Clock::now();
      ++ended_;
      if (status != Status::kOk) [[unlikely]] {
        r.error = s_.rma->last_error();
        if (error_.empty()) error_ = r.error;
      }
    }
    while (first_open_ < records_.size() && records_[first_open_].status != Status::kInProgress)
      ++first_open_;
  }

  // Lets the stream go on to `limit` batches in all.
  void extend(std::uint64_t limit) { s_.limit = limit; }
  // The target checked every batch below `n`: their space may be written again.
  void checked(std::uint64_t n) { checked_ = std::max(checked_, n); }
  // Where the target checks nothing: a batch's space may be written again once it ended, and
  // every batch before it.
  void reuse_ended() { checked(first_open_); }

  [[nodiscard]] std::size_t in_flight() const noexcept { return records_.size() - ended_; }
  [[nodiscard]] bool done() const noexcept {
    return in_flight() == 0 && (refused_.has_value() || records_.size() == s_.limit);
  }
  [[nodiscard]] std::uint64_t ended() const noexcept { return ended_; }
  [[nodiscard]] std::size_t count(Status status) const {
    return static_cast<std::size_t>(
        std::count_if(records_.begin(), records_.end(),
                      [&](const BatchRecord& r) { return r.status == status; }));
  }
  // The batches that ended kOk come first in post order: no kOk after a failure.
  [[nodiscard]] bool ok_is_prefix() const {
    const auto first_failure = std::find_if(records_.begin(), records_.end(), [](const auto& r) {
      return r.status != Status::kOk && r.status != Status::kInProgress;
    });
    return std::none_of(first_failure, records_.end(),
                        [](const BatchRecord& r) { return r.status == Status::kOk; });
  }
  [[nodiscard]] const std::vector<BatchRecord>& records() const noexcept { return records_; }
  [[nodiscard]] std::optional<Status> refused() const noexcept { return refused_; }
  [[nodiscard]] Clock::time_point refused_at() const noexcept { return refused_at_; }
  [[nodiscard]] const std::string& refusal() const noexcept { return refusal_; }
  // The first failed batch's last_error().
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  Setup s_;
  Ring local_ring_;
  Ring remote_ring_;
  std::vector<BatchRecord> records_;
  std::vector<RmaBlock> blocks_;
  std::optional<PlannedBatch> staged_;
  std::pair<std::size_t, std::size_t> staged_at_;
  std::uint64_t checked_ = 0;
  std::uint64_t ended_ = 0;
  std::size_t first_open_ = 0;
  std::optional<Status> refused_;
  Clock::time_point refused_at_;
  std::string refusal_;
  std::string error_;
};

inline std::unique_ptr<RmaTarget> accept_rma_one(Listener& listener,
                                                 std::chrono::seconds timeout = 30s) {
  std::unique_ptr<RmaTarget> target;
  poll_until([&] { return target != nullptr; }, [&] { target = listener.accept_rma(); },
             "accept_rma", timeout);
  return target;
}

inline std::unique_ptr<RmaInitiator> connect_rma_one(Context& context, const Handle& handle,
                                                     std::chrono::seconds timeout = 30s) {
  RmaConnector connector = context.connect_rma(handle);
  std::unique_ptr<RmaInitiator> initiator;
  poll_until([&] { return initiator != nullptr; }, [&] { initiator = connector.poll(); },
             "connect_rma", timeout);
  return initiator;
}

// Bytes read from a region filled with fill_pattern(seed) from its first byte: `bytes` must be
// what lies at `first` there.
inline std::string check_pattern_at(std::span<const std::byte> bytes, std::uint64_t seed,
                                    std::size_t first) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern_byte(seed, first + i)) {
      return "byte " + std::to_string(i) + " of " + std::to_string(bytes.size()) + " read from " +
             std::to_string(first) + " is " + std::to_string(static_cast<int>(bytes[i]));
    }
  }
  return {};
}

// The target polls until the initiator's u64 message arrives on `channel`, checking each
// notification with `on_notification`; returns the message.
template <typename OnNotification>
std::uint64_t serve_until_message(RmaTarget& target, Channel& channel,
                                  OnNotification&& on_notification, const std::string& what,
                                  std::chrono::seconds timeout = 120s) {
  std::optional<std::uint64_t> message;
  unsigned idle = 0;
  poll_until([&] { return message.has_value(); },
             [&] {
               if (auto notification = target.poll()) {
                 on_notification(*notification);
               } else if (++idle % 64 == 0 && channel.readable()) {  // a syscall: not every turn
                 message = channel.recv_value<std::uint64_t>();
               }
             },
             what, timeout);
  return *message;
}

inline std::size_t endpoints(const ContextStats& stats) {
  std::size_t total = 0;
  for (const auto& [nic, count] : stats.endpoints_per_nic) total += count;
  return total;
}

inline long long milliseconds(Clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
}

}  // namespace loom::test

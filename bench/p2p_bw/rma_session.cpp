#include "p2p_bw/rma_session.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "p2p_bw/session.hpp"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

std::uint64_t nanos(Clock::time_point t) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

Spread spread_of(std::vector<double>& times) {
  Spread spread;
  spread.samples = times.size();
  if (times.empty()) return spread;
  std::sort(times.begin(), times.end());
  spread.p50_us = times[times.size() / 2];
  spread.p99_us = times[std::min(times.size() - 1, times.size() * 99 / 100)];
  return spread;
}

std::byte pattern(std::uint64_t seed, std::size_t i) {
  return static_cast<std::byte>(((seed * 131 + i * 7 + (i >> 9)) & 0xff) | 1);
}

// The seed of block i of batch k (writes), or of the target's slot j (reads).
std::uint64_t write_seed(std::uint64_t batch, std::size_t block) {
  return batch * 65537 + block;
}
std::uint64_t slot_seed(std::size_t slot) {
  return 0xC0FFEE + slot;
}

}  // namespace

RmaSession::RmaSession(const Options& options, Oob& oob)
    : options_(options),
      oob_(oob),
      context_(std::make_unique<Context>(make_config(options))),
      slab_(options.memory),
      slot_sets_(options.verify ? options.window : 1) {}

RmaSession::~RmaSession() = default;

SetupFigures RmaSession::connect_all() {
  const long rss_before = resident_kib();
  const auto timeout = std::chrono::seconds(options_.timeout_s);
  const auto start = Clock::now();
  if (options_.is_client()) {
    RmaConnector connector = context_->connect_rma(Handle::from_bytes(oob_.receive()));
    while (!(initiator_ = connector.poll())) {
      if (Clock::now() - start > timeout) throw std::runtime_error("connect: peer did not answer");
    }
  } else {
    Listener listener = context_->listen();
    oob_.send(listener.handle().view());
    while (!(target_ = listener.accept_rma())) {
      if (Clock::now() - start > timeout) throw std::runtime_error("accept: peer did not connect");
    }
  }
  SetupFigures figures;
  figures.median_connect_us = micros(Clock::now() - start);
  figures.comms_held = 1;
  figures.memory_per_comm_kib = static_cast<double>(resident_kib() - rss_before);
  oob_.sync();
  return figures;
}

template <typename Step>
auto RmaSession::shared(Step&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const SharedError&) {
    throw;
  } catch (const std::exception& e) {
    try {
      tell(Word::kAbort, {reinterpret_cast<const std::byte*>(e.what()), std::strlen(e.what())});
    } catch (const std::exception&) {
      // The peer is gone already: it saw its own error.
    }
    throw SharedError(e.what());
  }
}

void RmaSession::tell(Word word, std::span<const std::byte> body) {
  std::vector<std::byte> message(sizeof word + body.size());
  std::memcpy(message.data(), &word, sizeof word);
  if (!body.empty()) std::memcpy(message.data() + sizeof word, body.data(), body.size());
  oob_.send(message);
}

std::vector<std::byte> RmaSession::hear(Word expected) {
  std::vector<std::byte> message = oob_.receive();
  Word word{};
  if (message.size() < sizeof word) throw std::runtime_error("bootstrap: a short message");
  std::memcpy(&word, message.data(), sizeof word);
  message.erase(message.begin(), message.begin() + sizeof word);
  if (word == Word::kAbort) {
    const std::string why(reinterpret_cast<const char*>(message.data()), message.size());
    throw SharedError(options_.is_client() ? "server: " + why : why);
  }
  if (word != expected) throw std::runtime_error("bootstrap: out of step");
  return message;
}

void RmaSession::heed_abort() {
  if (oob_.readable()) (void)hear(Word::kAbort);
}

// The slab, its registration, and (initiator) the blocks of each slot set; the target's
// descriptor crosses over. Shuffled offsets: one permutation per size, the same on both sides
// (one binary, one seed), so that the target knows where each block lands.
void RmaSession::prepare(std::size_t size) {
  const std::size_t blocks = options_.blocks;
  const bool same = options_.offsets == Offsets::kSame;
  const std::size_t slots = same ? 1 : slot_sets_ * blocks;
  if (initiator_ && remote_.valid()) initiator_->forget(remote_);
  region_.reset();
  slab_.assign(slots * size, std::byte{0});
  size_ = size;
  permutation_.resize(blocks);
  std::iota(permutation_.begin(), permutation_.end(), 0u);
  if (options_.offsets == Offsets::kShuffled) {
    std::mt19937_64 rng(size);
    std::shuffle(permutation_.begin(), permutation_.end(), rng);
  }
  last_writer_.assign(slot_sets_, 0);
  if (!options_.is_client() && options_.verify && options_.op == Op::kRead) {
    for (std::size_t slot = 0; slot < slots; ++slot) {
      fill(slab_.data() + slot * size, size, slot_seed(slot));
    }
  }
  region_ = context_->register_memory(slab_.data(), slab_.size(), slab_.type(), slab_.device());
  if (!options_.is_client()) {
    tell(Word::kDescriptor, target_->export_region(region_));
    return;
  }
  remote_ = initiator_->import_region(hear(Word::kDescriptor));
  blocks_.clear();
  for (std::size_t set = 0; set < slot_sets_; ++set) {
    for (std::size_t i = 0; i < blocks; ++i) {
      blocks_.push_back({.local = region_,
                         .local_offset = same ? 0 : (set * blocks + i) * size,
                         .remote = remote_,
                         .remote_offset = same ? 0 : (set * blocks + permutation_[i]) * size,
                         .length = size});
    }
  }
  requests_.assign(options_.window, Request{});
  posted_at_.assign(options_.window, Clock::time_point{});
}

std::span<const RmaBlock> RmaSession::batch_blocks(std::uint64_t batch) const {
  return std::span(blocks_).subspan(slot_set(batch) * options_.blocks, options_.blocks);
}

void RmaSession::post(std::uint64_t batch) {
  const std::size_t ring = batch % options_.window;
  if (options_.verify) {
    if (options_.op == Op::kWrite) fill_for_write(batch);
    if (options_.op == Op::kRead) clear_for_read(batch);
  }
  const auto now = Clock::now();
  Posted posted;
  if (options_.op == Op::kWrite) {
    std::optional<Notification> notification;
    if (options_.notify) notification = Notification{.tag = batch, .value = nanos(now)};
    posted = initiator_->write(batch_blocks(batch), notification, options_.notify_protocol);
  } else {
    posted = initiator_->read(batch_blocks(batch));
  }
  if (posted.status != Status::kOk) {
    throw std::runtime_error("batch " + std::to_string(batch) + " refused (" +
                             std::string(to_string(posted.status)) +
                             "): " + initiator_->last_error());
  }
  requests_[ring] = posted.request;
  posted_at_[ring] = now;
}

// The oldest batch is tested until done, then the next: batches finish in post order, and
// testing a later one first would read the same completion queue again for nothing. Each batch
// done makes room for the next at once. The out-of-band channel is looked at when the clock is
// (every 256 tests): the target says nothing during a pass unless it failed.
void RmaSession::initiate(std::size_t count, std::size_t window, Pass& pass) {
  const std::uint64_t first = batch_;
  std::size_t posted = 0;
  batch_us_.clear();
  batch_us_.reserve(count);
  const auto patience = std::chrono::seconds(options_.timeout_s);
  const auto start = Clock::now();
  auto deadline = start + patience;
  bool progressed = false;
  for (; posted < std::min(window, count); ++posted) post(first + posted);
  Clock::time_point end = start;
  for (std::size_t done = 0, spins = 0; done < count; ++spins) {
    const std::uint64_t batch = first + done;
    const std::size_t ring = batch % options_.window;
    const Status status = initiator_->test(requests_[ring]);
    if (status == Status::kInProgress) {
      if ((spins & 255) != 255) continue;
      const auto now = Clock::now();
      if (progressed) deadline = now + patience;
      progressed = false;
      if (now > deadline) {
        throw std::runtime_error("batch " + std::to_string(batch) + " made no progress for " +
                                 std::to_string(patience.count()) + " s");
      }
      heed_abort();
      continue;
    }
    end = Clock::now();
    if (status != Status::kOk) {
      throw std::runtime_error(std::string(op_name(options_.op)) + " batch " +
                               std::to_string(batch) + ": " + std::string(to_string(status)) +
                               ": " + initiator_->last_error());
    }
    batch_us_.push_back(micros(end - posted_at_[ring]));
    if (options_.verify && options_.op == Op::kRead) check_read(batch);
    ++done;
    progressed = true;
    if (posted < count) post(first + posted++);
  }
  pass.seconds = std::chrono::duration<double>(end - start).count();
  pass.batch = spread_of(batch_us_);
}

// Polls until the initiator said it is done and, with notifications, until every batch's came:
// in post order, once each, with the batch's block and byte counts.
RmaSession::TargetFigures RmaSession::serve(std::size_t count) {
  const bool notified = options_.op == Op::kWrite && options_.notify;
  const std::size_t expected = notified ? count : 0;
  const std::uint64_t first = batch_;
  const auto patience = std::chrono::seconds(options_.timeout_s);
  std::optional<Clock::time_point> deadline;  // once the initiator is done
  std::size_t seen = 0;
  notify_us_.clear();
  notify_us_.reserve(expected);
  for (std::size_t spins = 0; !deadline || seen < expected; ++spins) {
    if (const std::optional<Notification> n = target_->poll()) {
      const auto now = Clock::now();
      const std::uint64_t batch = first + seen;
      if (n->tag != batch || n->blocks != options_.blocks || n->bytes != options_.blocks * size_ ||
          seen == expected) {
        throw std::runtime_error("notification " + std::to_string(seen) + " names batch " +
                                 std::to_string(n->tag) + " of " + std::to_string(n->blocks) +
                                 " blocks, " + std::to_string(n->bytes) +
                                 " bytes; expected batch " + std::to_string(batch) + " of " +
                                 std::to_string(options_.blocks) + " blocks");
      }
      if (options_.loopback) notify_us_.push_back(static_cast<double>(nanos(now) - n->value) / 1e3);
      ++seen;
      continue;
    }
    if ((spins & 255) != 255) continue;
    if (!deadline && oob_.readable()) {
      (void)hear(Word::kDone);
      deadline = Clock::now() + patience;
    }
    if (deadline && Clock::now() > *deadline) {
      throw std::runtime_error(std::to_string(expected - seen) + " of " + std::to_string(expected) +
                               " notifications missing " + std::to_string(patience.count()) +
                               " s after the initiator's batches were done");
    }
  }
  for (std::size_t k = 0; k < count && k < slot_sets_; ++k) {
    last_writer_[slot_set(first + count - 1 - k)] = first + count - k;
  }
  return {.notify = spread_of(notify_us_), .notifications = seen};
}

RmaSession::Pass RmaSession::pass(std::size_t count, std::size_t window) {
  Pass result;
  tell(Word::kSync);  // the peer may have failed instead: hear() says so
  (void)hear(Word::kSync);
  if (options_.is_client()) {
    shared([&] { initiate(count, window, result); });
    tell(Word::kDone);
    const std::vector<std::byte> body = hear(Word::kFigures);
    TargetFigures target;
    if (body.size() != sizeof target) throw std::runtime_error("bootstrap: bad figures");
    std::memcpy(&target, body.data(), sizeof target);
    result.notify = target.notify;
  } else {
    const TargetFigures target = shared([&] {
      TargetFigures figures = serve(count);
      if (options_.verify && options_.op == Op::kWrite) check_writes();
      return figures;
    });
    tell_value(Word::kFigures, target);
  }
  batch_ += count;
  return result;
}

Figures RmaSession::measure(std::size_t size) {
  shared([&] { prepare(size); });
  Figures figures;
  figures.size = size;
  figures.rma.blocks = options_.blocks;
  const std::size_t batches =
      options_.iterations ? options_.iterations : default_batches(size, options_.blocks);
  if (options_.bandwidth) {
    if (options_.warmup > 0) (void)pass(options_.warmup, options_.window);
    const Pass timed = pass(batches, options_.window);
    figures.iterations = batches;
    figures.seconds = timed.seconds;
    figures.bytes = static_cast<std::uint64_t>(batches) * options_.blocks * size;
    figures.rma.batch = timed.batch;
    figures.rma.notify = timed.notify;
  }
  if (options_.pingpong) {
    const std::size_t rounds = options_.lat_iterations != 0
                                   ? options_.lat_iterations
                                   : std::clamp<std::size_t>(batches / 10, 20, 1000);
    if (options_.warmup > 0) (void)pass(options_.warmup, 1);
    const Pass lone = pass(rounds, 1);
    figures.rma.lone_batch = lone.batch;
    figures.rma.lone_notify = lone.notify;
    figures.lat_rounds = rounds;
  }
  return figures;
}

// ---- verification (-v) ----

void RmaSession::fill(std::byte* at, std::size_t length, std::uint64_t seed) {
  if (!slab_.on_device()) {
    for (std::size_t i = 0; i < length; ++i) at[i] = pattern(seed, i);
    return;
  }
  staging_.resize(length);
  for (std::size_t i = 0; i < length; ++i) staging_[i] = pattern(seed, i);
  slab_.write(at, staging_.data(), length);
}

void RmaSession::check(const std::byte* at, std::size_t length, std::uint64_t seed,
                       const char* what) {
  if (slab_.on_device()) {
    staging_.resize(length);
    slab_.read(at, staging_.data(), length);
    at = staging_.data();
  }
  for (std::size_t i = 0; i < length; ++i) {
    if (at[i] != pattern(seed, i)) {
      throw std::runtime_error(std::string("verify: ") + what + ", byte " + std::to_string(i) +
                               " is wrong");
    }
  }
}

void RmaSession::fill_for_write(std::uint64_t batch) {
  for (std::size_t i = 0; i < options_.blocks; ++i) {
    const RmaBlock& block = batch_blocks(batch)[i];
    fill(slab_.data() + block.local_offset, size_, write_seed(batch, i));
  }
}

void RmaSession::clear_for_read(std::uint64_t batch) {
  const std::vector<std::byte> zeros(size_);
  for (const RmaBlock& block : batch_blocks(batch)) {
    slab_.write(slab_.data() + block.local_offset, zeros.data(), size_);
  }
}

void RmaSession::check_read(std::uint64_t batch) {
  const std::size_t base = slot_set(batch) * options_.blocks;
  for (std::size_t i = 0; i < options_.blocks; ++i) {
    const std::string what = "batch " + std::to_string(batch) + " block " + std::to_string(i);
    check(slab_.data() + (base + i) * size_, size_, slot_seed(base + permutation_[i]),
          what.c_str());
  }
}

// Each slot set holds what the last batch that used it wrote (an earlier one, overwritten by a
// later one in flight, cannot be checked once notified).
void RmaSession::check_writes() {
  for (std::size_t set = 0; set < slot_sets_; ++set) {
    if (last_writer_[set] == 0) continue;
    const std::uint64_t batch = last_writer_[set] - 1;
    for (std::size_t i = 0; i < options_.blocks; ++i) {
      const std::string what = "batch " + std::to_string(batch) + " block " + std::to_string(i);
      check(slab_.data() + (set * options_.blocks + permutation_[i]) * size_, size_,
            write_seed(batch, i), what.c_str());
    }
  }
}

}  // namespace loom::bench

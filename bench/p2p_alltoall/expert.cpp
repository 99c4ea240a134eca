#include "p2p_alltoall/expert.hpp"

#include <stdexcept>
#include <utility>

namespace loom::bench {
namespace {

constexpr std::uint64_t kTokenKind = 3;
constexpr std::uint64_t kRouteKind = 4;
// A notification's tag: phase (2 bits), iteration (38), sender (24).
constexpr unsigned kSenderBits = 24;
constexpr unsigned kIterationBits = 38;
static_assert(2 + kIterationBits + kSenderBits == 64, "a notification tag is 64 bits");
// The write that carries a count when no token goes to a rank.
constexpr std::size_t kEmptyWrite = 8;

std::uint64_t tag_of(std::uint64_t phase, std::uint64_t iteration, int sender) {
  return (phase << (kIterationBits + kSenderBits)) |
         ((iteration & ((std::uint64_t{1} << kIterationBits) - 1)) << kSenderBits) |
         static_cast<std::uint64_t>(sender);
}

}  // namespace

Expert::Expert(const AlltoallOptions& options, Mesh& mesh)
    : options_(options),
      mesh_(mesh),
      tokens_(options.tokens),
      hidden_(options.hidden),
      topk_(options.topk_for(mesh.size())) {
  const auto n = static_cast<std::size_t>(mesh.size());
  if (topk_ == 0 || topk_ > n - 1) {
    throw std::invalid_argument("--topk " + std::to_string(topk_) +
                                ": needs 1 to N-1 = " + std::to_string(n - 1));
  }
  if (n >= (std::size_t{1} << kSenderBits)) throw std::invalid_argument("ep: too many ranks");
  token_buffer_.assign(tokens_ * hidden_, std::byte{0x3C});
  dispatch_buffer_.assign(n * tokens_ * hidden_, std::byte{0});
  combine_buffer_.assign(n * tokens_ * hidden_, std::byte{0});
  Context& context = mesh.context();
  token_region_ = context.register_memory(token_buffer_.data(), token_buffer_.size());
  dispatch_region_ = context.register_memory(dispatch_buffer_.data(), dispatch_buffer_.size());
  combine_region_ = context.register_memory(combine_buffer_.data(), combine_buffer_.size());
  to_.resize(n);
  from_.resize(n);
  scratch_.resize(n);
  blocks_.resize(n);
  for (auto& list : to_) list.reserve(tokens_);
  for (auto& blocks : blocks_) blocks.reserve(tokens_);
  pending_.reserve(n);
}

std::size_t Expert::slot_offset(int rank, std::size_t token) const {
  return (static_cast<std::size_t>(rank) * tokens_ + token) * hidden_;
}

void Expert::route(std::uint64_t iteration, int source,
                   std::vector<std::vector<std::uint32_t>>& to) {
  const int n = mesh_.size();
  for (auto& list : to) list.clear();
  for (std::size_t t = 0; t < tokens_; ++t) {
    others_.clear();
    for (int r = 0; r < n; ++r) {
      if (r != source) others_.push_back(r);
    }
    // The first k of a seeded shuffle: k distinct ranks.
    for (std::size_t i = 0; i < topk_; ++i) {
      const std::uint64_t draw = pattern_key(kRouteKind ^ (options_.seed << 8), iteration,
                                             static_cast<std::uint64_t>(source), t * 64 + i);
      const std::size_t j = i + draw % (others_.size() - i);
      std::swap(others_[i], others_[j]);
      to[static_cast<std::size_t>(others_[i])].push_back(static_cast<std::uint32_t>(t));
    }
  }
}

void Expert::poll_targets(std::uint64_t iteration, bool& progressed) {
  for (auto& target : mesh_.targets()) {
    while (const std::optional<Notification> note = target->poll()) {
      progressed = true;
      const std::uint64_t phase = note->tag >> (kIterationBits + kSenderBits);
      const std::uint64_t at =
          (note->tag >> kSenderBits) & ((std::uint64_t{1} << kIterationBits) - 1);
      const auto sender = static_cast<std::size_t>(note->tag & ((1u << kSenderBits) - 1));
      // A phase's notification may come one iteration early (its sender is a phase ahead).
      if (phase > kCombine || sender >= static_cast<std::size_t>(mesh_.size()) ||
          (at != iteration && at != iteration + 1)) {
        throw std::runtime_error("ep: a notification for phase " + std::to_string(phase) +
                                 ", iteration " + std::to_string(at) + " from rank " +
                                 std::to_string(sender) + " during iteration " +
                                 std::to_string(iteration));
      }
      Arrivals& arrivals = arrivals_[phase][at & 1];
      if (arrivals.count[sender] >= 0) {
        throw std::runtime_error("ep: a second notification from rank " + std::to_string(sender));
      }
      arrivals.count[sender] = static_cast<std::int64_t>(note->value);
      ++arrivals.arrived;
    }
  }
}

void Expert::exchange(Phase phase, std::uint64_t iteration) {
  const int n = mesh_.size();
  const int me = mesh_.rank();
  const Arrivals& arrivals = arrivals_[phase][iteration & 1];
  pending_.clear();
  // Batches built before this is called; post them in rank order from the next one up.
  for (int d = 1; d < n; ++d) {
    const int peer = (me + d) % n;
    const auto& blocks = blocks_[static_cast<std::size_t>(peer)];
    const std::uint64_t count =
        phase == kDispatch
            ? to_[static_cast<std::size_t>(peer)].size()
            : static_cast<std::uint64_t>(
                  arrivals_[kDispatch][iteration & 1].count[static_cast<std::size_t>(peer)]);
    RmaInitiator& initiator = mesh_.initiator(peer);
    const Notification note{.tag = tag_of(phase, iteration, me), .value = count};
    Posted posted = initiator.write(blocks, note);
    while (posted.status == Status::kRetry) {
      bool ignored = false;
      poll_targets(iteration, ignored);
      posted = initiator.write(blocks, note);
    }
    if (posted.status != Status::kOk) {
      throw std::runtime_error("ep: write to rank " + std::to_string(peer) + ": " +
                               initiator.last_error());
    }
    pending_.push_back({peer, posted.request});
  }
  std::size_t left = pending_.size();
  Pacer pacer(mesh_.yields(), std::chrono::seconds(options_.timeout_s),
              phase == kDispatch ? "ep dispatch" : "ep combine");
  while (left > 0 || arrivals.arrived < static_cast<std::size_t>(n - 1)) {
    bool progressed = false;
    // Keep testing the batches: a notification leaves once this rank saw its batch complete.
    for (Pending& p : pending_) {
      if (!p.request.valid()) continue;
      RmaInitiator& initiator = mesh_.initiator(p.peer);
      const Status status = initiator.test(p.request);
      if (status == Status::kInProgress) continue;
      if (status != Status::kOk) {
        throw std::runtime_error("ep: batch to rank " + std::to_string(p.peer) + ": " +
                                 initiator.last_error());
      }
      p.request = Request{};
      --left;
      progressed = true;
    }
    poll_targets(iteration, progressed);
    pacer.missing(left + static_cast<std::size_t>(n - 1) - arrivals.arrived);
    pacer.pass(progressed);
  }
}

void Expert::check_dispatch(int source, std::uint64_t iteration) const {
  const auto& expected = from_[static_cast<std::size_t>(source)];
  const std::int64_t count =
      arrivals_[kDispatch][iteration & 1].count[static_cast<std::size_t>(source)];
  if (count != static_cast<std::int64_t>(expected.size())) {
    throw std::runtime_error("ep -v: dispatch from rank " + std::to_string(source) + " counted " +
                             std::to_string(count) + " tokens, its routing " +
                             std::to_string(expected.size()));
  }
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const std::byte* data = dispatch_buffer_.data() + slot_offset(source, i);
    const std::uint64_t key =
        pattern_key(kTokenKind, static_cast<std::uint64_t>(source), expected[i], iteration);
    if (const std::size_t at = pattern_mismatch(data, hidden_, key); at != hidden_) {
      throw std::runtime_error("ep -v: dispatch from rank " + std::to_string(source) +
                               ", iteration " + std::to_string(iteration) + ": token " +
                               std::to_string(expected[i]) + " (slot " + std::to_string(i) +
                               "), byte " + std::to_string(at) + " differs");
    }
  }
}

void Expert::check_combine(int destination, std::uint64_t iteration) const {
  const auto& sent = to_[static_cast<std::size_t>(destination)];
  const std::int64_t count =
      arrivals_[kCombine][iteration & 1].count[static_cast<std::size_t>(destination)];
  if (count != static_cast<std::int64_t>(sent.size())) {
    throw std::runtime_error("ep -v: combine from rank " + std::to_string(destination) +
                             " counted " + std::to_string(count) + " tokens, " +
                             std::to_string(sent.size()) + " went there");
  }
  const auto me = static_cast<std::uint64_t>(mesh_.rank());
  for (std::size_t i = 0; i < sent.size(); ++i) {
    const std::byte* data = combine_buffer_.data() + slot_offset(destination, i);
    const std::uint64_t key = pattern_key(kTokenKind, me, sent[i], iteration);
    if (const std::size_t at = pattern_mismatch(data, hidden_, key); at != hidden_) {
      throw std::runtime_error("ep -v: combine from rank " + std::to_string(destination) +
                               ", iteration " + std::to_string(iteration) + ": token " +
                               std::to_string(sent[i]) + ", byte " + std::to_string(at) +
                               " differs");
    }
  }
}

nlohmann::json Expert::run() {
  const int n = mesh_.size();
  const int me = mesh_.rank();
  const auto ranks = static_cast<std::size_t>(n);
  const std::size_t iterations = expert_iterations(options_);
  const std::size_t total = options_.warmup + iterations;
  std::vector<double> samples[2];
  double seconds[2] = {0, 0};
  for (auto& phase : arrivals_) {
    for (Arrivals& a : phase) a.reset(ranks);
  }
  tokens_sent_[kDispatch] = tokens_sent_[kCombine] = 0;
  mesh_.world().barrier();
  for (std::uint64_t it = 0; it < total; ++it) {
    const bool timed = it >= options_.warmup;
    // Nothing of the next iteration has arrived yet: its sender needs this one's answer first.
    for (auto& phase : arrivals_) phase[(it + 1) & 1].reset(ranks);
    route(it, me, to_);
    if (options_.verify) {
      for (std::size_t t = 0; t < tokens_; ++t) {
        fill_pattern(token_buffer_.data() + t * hidden_, hidden_,
                     pattern_key(kTokenKind, static_cast<std::uint64_t>(me), t, it));
      }
      for (int s = 0; s < n; ++s) {
        if (s == me) continue;
        route(it, s, scratch_);
        from_[static_cast<std::size_t>(s)] = scratch_[static_cast<std::size_t>(me)];
      }
    }
    // Dispatch: the tokens routed to each rank, into its slots for this one.
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      auto& blocks = blocks_[static_cast<std::size_t>(peer)];
      const auto& list = to_[static_cast<std::size_t>(peer)];
      const RemoteRegion& slots = remote_[static_cast<std::size_t>(peer)][0];
      blocks.clear();
      for (std::size_t i = 0; i < list.size(); ++i) {
        blocks.push_back({token_region_, list[i] * hidden_, slots, slot_offset(me, i), hidden_});
      }
      if (blocks.empty())
        blocks.push_back({token_region_, 0, slots, slot_offset(me, 0), kEmptyWrite});
      if (timed) tokens_sent_[kDispatch] += list.size();
    }
    auto start = Clock::now();
    exchange(kDispatch, it);
    if (timed) samples[kDispatch].push_back(micros_between(start, Clock::now()));
    // Combine: every token received goes back to its source's slots for this rank.
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      if (options_.verify) check_dispatch(peer, it);
      const auto count = static_cast<std::size_t>(
          arrivals_[kDispatch][it & 1].count[static_cast<std::size_t>(peer)]);
      auto& blocks = blocks_[static_cast<std::size_t>(peer)];
      const RemoteRegion& slots = remote_[static_cast<std::size_t>(peer)][1];
      blocks.clear();
      for (std::size_t i = 0; i < count; ++i) {
        blocks.push_back(
            {dispatch_region_, slot_offset(peer, i), slots, slot_offset(me, i), hidden_});
      }
      if (blocks.empty()) {
        blocks.push_back(
            {dispatch_region_, slot_offset(peer, 0), slots, slot_offset(me, 0), kEmptyWrite});
      }
      if (timed) tokens_sent_[kCombine] += count;
    }
    start = Clock::now();
    exchange(kCombine, it);
    if (timed) samples[kCombine].push_back(micros_between(start, Clock::now()));
    if (options_.verify) {
      for (int peer = 0; peer < n; ++peer) {
        if (peer != me) check_combine(peer, it);
      }
    }
  }
  nlohmann::json row = {
      {"tokens", tokens_}, {"hidden", hidden_}, {"topk", topk_}, {"iterations", iterations}};
  const char* names[2] = {"dispatch", "combine"};
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<double>& s = samples[phase];
    for (double us : s) seconds[phase] += us / 1e6;
    const double sent = static_cast<double>(tokens_sent_[phase]);
    const double per_iteration = iterations ? sent / static_cast<double>(iterations) : 0;
    nlohmann::json figures = {
        {"tokens", per_iteration},
        {"bytes", per_iteration * static_cast<double>(hidden_)},
        {"mean_us", iterations ? seconds[phase] * 1e6 / static_cast<double>(iterations) : 0.0},
        {"tokens_per_s", seconds[phase] > 0 ? sent / seconds[phase] : 0.0},
        {"gb_per_s",
         seconds[phase] > 0 ? sent * static_cast<double>(hidden_) / seconds[phase] / 1e9 : 0.0},
        {"samples_us", s}};
    figures["p50_us"] = percentile(s, 50);
    figures["p99_us"] = percentile(s, 99);
    row[names[phase]] = figures;
  }
  return row;
}

}  // namespace loom::bench

// One side of a one-sided fi_p2p_bw run (--op write|read): the client is the initiator, the
// server the target. Per block size both sides hold a slab of --blocks slots, which every batch
// uses, as fabtests' window of messages shares one buffer (so the memory a run touches is a
// batch's, whatever -W); with -v, -W slot sets, batch k using set k mod W, so that no batch in
// flight overwrites another's bytes. The target's descriptor goes to the initiator over the
// out-of-band channel; then come windows of batches (W in flight, as fabtests keeps its window
// of messages) and a latency pass of one batch at a time.
//
// The target polls all along: notifications are what it waits for, and shm moves a write's bytes
// with the target's progress. Time-to-notify is the target's clock when poll() returned a batch's
// notification minus the initiator's when it posted the batch (the notification's value): one
// clock only with --loopback, so it is measured there alone.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/figures.hpp"
#include "common/memory.hpp"
#include "common/oob.hpp"
#include "common/options.hpp"
#include "loom/p2p.hpp"
#include "loom/rma.hpp"

namespace loom::bench {

// An error both processes know of: the side that found it told the other over the out-of-band
// channel (a server's error reaches the client as "server: ..."). With --loopback only the
// client prints it.
class SharedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RmaSession {
 public:
  RmaSession(const Options& options, Oob& oob);
  ~RmaSession();

  SetupFigures connect_all();
  Figures measure(std::size_t size);

  [[nodiscard]] Context& context() { return *context_; }
  [[nodiscard]] ProtocolCounts protocol_counts() const { return {}; }  // two-sided only

 private:
  using Clock = std::chrono::steady_clock;
  // What the two sides tell each other during a pass (the first 4 bytes of a message).
  enum class Word : std::uint32_t {
    kSync = 0x434E5953,        // a pass begins
    kDescriptor = 0x43534544,  // the target's region for this size
    kDone = 0x454E4F44,        // the initiator's batches of the pass are all done
    kFigures = 0x52474946,     // the target's time-to-notify for the pass
    kAbort = 0x54524241,       // the rest is why
  };
  struct TargetFigures {
    Spread notify;
    std::uint64_t notifications = 0;
  };
  struct Pass {
    double seconds = 0;
    Spread batch;
    Spread notify;
  };

  void prepare(std::size_t size);
  // `count` batches, `window` of them in flight.
  Pass pass(std::size_t count, std::size_t window);
  void initiate(std::size_t count, std::size_t window, Pass& pass);
  TargetFigures serve(std::size_t count);
  void post(std::uint64_t batch);
  [[nodiscard]] std::span<const RmaBlock> batch_blocks(std::uint64_t batch) const;
  [[nodiscard]] std::size_t slot_set(std::uint64_t batch) const { return batch % slot_sets_; }

  // -v: the initiator fills each write's blocks with the batch's pattern; the target checks,
  // after each pass, that every slot holds what the last batch to write it sent. Reads: the
  // target's slab holds a pattern per slot; the initiator checks each batch once done.
  void fill_for_write(std::uint64_t batch);
  void clear_for_read(std::uint64_t batch);
  void check_read(std::uint64_t batch);
  void check_writes();
  void fill(std::byte* at, std::size_t length, std::uint64_t seed);
  void check(const std::byte* at, std::size_t length, std::uint64_t seed, const char* what);

  void tell(Word word, std::span<const std::byte> body = {});
  template <typename T>
  void tell_value(Word word, const T& value) {
    tell(word, {reinterpret_cast<const std::byte*>(&value), sizeof value});
  }
  // The next message, which must be `expected`: its body. Throws SharedError on an abort.
  std::vector<std::byte> hear(Word expected);
  // During a pass the peer writes only to abort: throws SharedError if it did. Never blocks.
  void heed_abort();
  // Runs `step`; an error it throws is told to the peer first, and rethrown as a SharedError.
  template <typename Step>
  auto shared(Step&& step) -> decltype(step());

  const Options& options_;
  Oob& oob_;
  std::unique_ptr<Context> context_;
  // Declared before the connection and the region: freed after both.
  MessageBuffer slab_;
  std::unique_ptr<RmaInitiator> initiator_;
  std::unique_ptr<RmaTarget> target_;
  // Deregistered before the connection closes: a lane that closes its endpoints while a context
  // region is still registered on them fails fi_close with EBUSY under FI_MR_ENDPOINT (epmr).
  // Batches still in flight (an error's way out) keep the registration until they end.
  Region region_;
  RemoteRegion remote_;
  std::size_t size_ = 0;
  std::size_t slot_sets_;                   // -W with -v, else 1
  std::vector<std::uint32_t> permutation_;  // block i of a batch lands in slot permutation_[i]
  std::vector<RmaBlock> blocks_;            // the slot sets' blocks, built per size
  std::vector<Request> requests_;           // the batches in flight: batch k at k mod W
  std::vector<Clock::time_point> posted_at_;
  std::vector<std::uint64_t> last_writer_;  // by slot set: the last batch that wrote it (+1)
  std::vector<double> batch_us_;
  std::vector<double> notify_us_;
  std::vector<std::byte> staging_;  // a block's bytes on the host, for device memory
  std::uint64_t batch_ = 0;         // running batch number: both sides count alike
};

}  // namespace loom::bench

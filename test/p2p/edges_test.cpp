// Edges of what the provider gives: registrations whose memory is replaced, the provider's
// message size limit. One process, a communicator pair connected to itself.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <catch2/catch.hpp>
#include <spdlog/sinks/base_sink.h>
#include <sys/mman.h>

#include "support/p2p_pair.hpp"
#include "util/log.hpp"

namespace loom::test {
namespace {

struct Totals {
  std::size_t registrations = 0;  // fid_mr objects held by every lane
  std::uint64_t misses = 0;       // registrations made
  std::uint64_t hits = 0;         // registrations shared
};

Totals totals(const Context& context) {
  Totals t;
  for (const LaneDescription& lane : context.stats().lanes) {
    t.registrations += lane.registrations;
    t.misses += lane.registrations_made;
    t.hits += lane.registrations_shared;
  }
  return t;
}

// Anonymous pages at `hint` (MAP_FIXED when given), filled with `seed`'s pattern.
std::span<std::byte> map_pages(void* hint, std::size_t size, std::uint64_t seed) {
  void* pages = mmap(hint, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (hint != nullptr ? MAP_FIXED : 0), -1, 0);
  require(pages != MAP_FAILED, std::string("mmap: ") + std::strerror(errno));
  std::span<std::byte> bytes{static_cast<std::byte*>(pages), size};
  fill_pattern(bytes, seed);
  return bytes;
}

// Counts what loom logs at warning level and above while it lives.
class LogCounter {
 public:
  LogCounter() : sink_(std::make_shared<Sink>()) {
    sink_->set_level(spdlog::level::warn);
    util::log().sinks().push_back(sink_);
  }
  ~LogCounter() { util::log().sinks().pop_back(); }
  LogCounter(const LogCounter&) = delete;
  LogCounter& operator=(const LogCounter&) = delete;
  // Lines containing `text`, and the first of them.
  std::size_t count(const std::string& text) const {
    std::lock_guard lock(sink_->lock());
    std::size_t n = 0;
    for (const auto& line : sink_->lines) n += line.find(text) != std::string::npos;
    return n;
  }
  std::string first(const std::string& text) const {
    std::lock_guard lock(sink_->lock());
    for (const auto& line : sink_->lines)
      if (line.find(text) != std::string::npos) return line;
    return {};
  }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    std::vector<std::string> lines;
    std::mutex& lock() { return mutex_; }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      lines.emplace_back(msg.payload.data(), msg.payload.size());
    }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
};

}  // namespace

TEST_CASE("p2p registration: memory mapped again at a deregistered address is registered anew",
          "[local]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "connect to self");
  // Above the eager limit: the receive buffer is the target of an RMA write through its key.
  const std::size_t size = std::size_t{1} << 20;

  std::span<std::byte> source = map_pages(nullptr, size, 1);
  std::span<std::byte> target = map_pages(nullptr, size, 2);
  const Totals empty = totals(context);
  out->deregister(out->register_memory(source.data(), size));
  in->deregister(in->register_memory(target.data(), size));
  // Nothing registered is left behind once its last user deregistered.
  CHECK(totals(context).registrations == empty.registrations);

  // Freed and mapped again at the same addresses with other contents: on RDMA NICs a
  // registration kept from before would still pin the old pages.
  REQUIRE(munmap(source.data(), size) == 0);
  REQUIRE(munmap(target.data(), size) == 0);
  source = map_pages(source.data(), size, 3);
  target = map_pages(target.data(), size, 4);
  const Totals before = totals(context);
  MemoryRegion source_region = out->register_memory(source.data(), size);
  MemoryRegion target_region = in->register_memory(target.data(), size);
  const Totals after = totals(context);
  CHECK(after.misses == before.misses + 2);  // two new registrations
  CHECK(after.hits == before.hits);          // not the ones made before the unmap

  RecvBuffer buffer{target.data(), size, 9, target_region};
  Request receive;
  Request send;
  REQUIRE(post_into(in->irecv({&buffer, 1}), receive) == Status::kOk);
  REQUIRE(post_into(out->isend(source.data(), size, 9, source_region), send) == Status::kOk);
  finish(*out, send);
  CHECK(finish(*in, receive) == size);
  CHECK(check_pattern(target, 3).empty());  // the new bytes, into the new pages

  // Concurrent users of the same pages still share one registration.
  MemoryRegion shared = out->register_memory(source.data() + 100, size - 200);
  CHECK(totals(context).hits == after.hits + 1);
  out->deregister(shared);
  out->deregister(source_region);
  in->deregister(target_region);
  CHECK(totals(context).registrations == empty.registrations);
  munmap(source.data(), size);
  munmap(target.data(), size);
}

// The meson test sets FI_EPMR_FAIL_RECV_AFTER on epmr: once set up, every control receive that
// is consumed cannot be reposted (fi_recv fails with -FI_EIO), so its slot waits in the control
// channel's repost queue and is retried at every poll, and close finds slots that are not posted.
TEST_CASE("p2p control receives that cannot be reposted: logs bounded, close cancels only posted",
          "[recv-faults]") {
  if (std::getenv("FI_EPMR_FAIL_RECV_AFTER") == nullptr) {
    SUCCEED("needs epmr's FI_EPMR_FAIL_RECV_AFTER");
    return;
  }
  LogCounter log;
  const auto start = std::chrono::steady_clock::now();
  {
    Context context(test_config(1));
    Listener listener = context.listen();
    Connector connector = context.connect(listener.handle());
    auto [out, in] = connect_both(connector, listener, "connect to self");
    // Rendezvous messages: each takes a clear-to-send, and so a control receive.
    for (std::uint64_t i = 0; i < 8; ++i) exchange(*out, *in, i, i, 1 << 20);
    out->close();
    in->close();
  }
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
          .count();
  INFO("first repost failure: " << log.first("fi_recv"));
  INFO("first cancel error: " << log.first("fi_cancel"));
  CHECK(log.count("fi_recv") >= 1);  // the knob bit
  // Per rail, the first failure and then at most one line per second; the control rails here
  // are the bootstrap's and one per lane.
  const std::size_t control_rails = 3;
  CHECK(log.count("fi_recv") <= control_rails * (static_cast<std::size_t>(seconds) + 2));
  // Slots waiting to be reposted are not cancelled: no fi_cancel failure at close.
  CHECK(log.count("fi_cancel") == 0);
}

// The meson test sets FI_EPMR_MAX_MSG_SIZE on epmr: it reports that max_msg_size and refuses
// any send, write or read longer than it. A message that arrives whole over one data rail was
// therefore sent in pieces no longer than the limit.
TEST_CASE("p2p messages beyond the provider's max_msg_size are striped or refused clearly",
          "[max-msg]") {
  const char* knob = std::getenv("FI_EPMR_MAX_MSG_SIZE");
  if (knob == nullptr) {
    SUCCEED("needs epmr's FI_EPMR_MAX_MSG_SIZE");
    return;
  }
  const std::size_t max_msg = std::stoull(knob);
  Config config = test_config(1);
  config.eager_max = 2 * max_msg;  // above the provider's limit: the limit wins
  Context context(config);
  // 8 stripes of at most max_msg_size each, the last taking up to 7 bytes of remainder.
  const std::size_t largest = context.nics().at(0).max_message_size;
  CHECK(largest == 8 * (max_msg - 7));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "connect to self");

  // Eager-sized but over the limit; three times the limit; the largest the NIC reports.
  for (std::size_t size : {max_msg + 1000, 3 * max_msg, largest}) {
    INFO("message of " << size << " bytes, max_msg_size " << max_msg);
    exchange(*out, *in, size, size, size);
  }
  CHECK(out->stats().eager == 0);

  std::vector<std::byte> buffer(largest + 1);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request request;
  CHECK(post_into(out->isend(buffer.data(), buffer.size(), 1, region), request) ==
        Status::kInvalid);
  CHECK(!request.valid());
  CHECK_THAT(out->last_error(), Catch::Contains(std::to_string(buffer.size()) + " bytes") &&
                                    Catch::Contains("max_msg_size") &&
                                    Catch::Contains(std::to_string(max_msg)) &&
                                    Catch::Contains("epmr"));
  out->deregister(region);
  // The communicator goes on.
  exchange(*out, *in, 11, 11, 3 * max_msg);
}

}  // namespace loom::test

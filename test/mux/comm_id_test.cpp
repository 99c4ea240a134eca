// Comm ids carry a generation: a closed communicator's id does not come back for thousands of
// attaches on its lane, and a control message or a remote write still addressed to it is
// dropped (and counted) instead of being handed to the communicator that took its slot (a late
// clear-to-send taken by a new communicator would let the peer write into a buffer it already
// gave back).
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/config.hpp"
#include "mux/lane.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "ofi/selection.hpp"

namespace loom::test {
namespace {

struct RecordingPort final : mux::CommPort {
  std::vector<std::uint8_t> types;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte>) override {
    types.push_back(header.type);
  }
  void on_remote_write(mux::WriteImmediate) override {}
  void on_deferred() override {}
  [[nodiscard]] bool drained() const noexcept override { return true; }
  [[nodiscard]] bool abandoned() const noexcept override { return false; }
  void abandon_registrations() noexcept override {}
};

struct WriteDone final : ofi::CompletionHandler {
  bool done = false;
  Status status = Status::kOk;
  void on_completion(ofi::OpContext&, const ofi::Completion& completion) override {
    done = true;
    status = completion.status;
  }
};

constexpr std::uint8_t kStaleType = 200;
constexpr std::uint8_t kFreshType = 201;

TEST_CASE("mux ids of closed communicators are not reused soon and their traffic is dropped",
          "[local]") {
  auto nics = ofi::open_nics(Config::from_env());
  std::vector<ofi::Nic*> pointers{nics.front().get()};
  std::atomic<std::size_t> deferred{0};
  mux::Lane lane(ofi::RailPlacement::round_robin(pointers, 1, 1), mux::LaneShape{}, mux::LaneKey{},
                 1, deferred);
  std::lock_guard lock(lane.lock());

  RecordingPort closed;
  const mux::CommId stale = lane.attach(closed);
  lane.detach(stale);

  // Open/close churn, with a few communicators staying open the whole time.
  std::vector<std::unique_ptr<RecordingPort>> resident;
  for (int i = 0; i < 5; ++i) {
    resident.push_back(std::make_unique<RecordingPort>());
    REQUIRE(lane.attach(*resident.back()) != stale);
  }
  RecordingPort churn;
  for (int i = 0; i < 4000; ++i) {
    const mux::CommId id = lane.attach(churn);
    INFO("attach " << i);
    REQUIRE(id != stale);
    lane.detach(id);
  }

  // The communicator that now holds the stale id's slot hears only what is addressed to it.
  RecordingPort fresh;
  mux::CommId fresh_id = lane.attach(fresh);
  while ((fresh_id & 15) != (stale & 15)) {
    lane.detach(fresh_id);
    fresh_id = lane.attach(fresh);
  }
  REQUIRE(fresh_id != stale);
  const ofi::Address self = lane.acquire_peer(1, lane.rails().control(0).address());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto send = [&](std::uint8_t type, mux::CommId to) {
    Status status = lane.control().send(0, self, type, to, {});
    while (status == Status::kRetry && std::chrono::steady_clock::now() < deadline) {
      lane.progress();  // rxm connects to the address first
      status = lane.control().send(0, self, type, to, {});
    }
    REQUIRE(status == Status::kOk);
  };
  send(kStaleType, stale);
  send(kFreshType, fresh_id);
  while (fresh.types.empty() && std::chrono::steady_clock::now() < deadline) lane.progress();
  for (int i = 0; i < 100; ++i) lane.progress();  // anything else that was going to arrive
  REQUIRE(fresh.types == std::vector<std::uint8_t>{kFreshType});
  CHECK(closed.types.empty());
  CHECK(lane.stats().stray_control == 1);
  for (auto& port : resident) CHECK(port->types.empty());

  // A late rendezvous write still addressed to the closed id: its CQ data reaches no one.
  std::vector<std::byte> target(64);
  ofi::MemoryRegistration registration(ofi::registration_targets(lane.rails().rails()),
                                       target.data(), target.size());
  ofi::Rail& data = lane.rails().data(0);
  const ofi::Address self_data = lane.acquire_peer(0, data.address());
  WriteDone write;
  ofi::OpContext op{.provider_scratch = {}, .handler = &write};
  const std::uint32_t immediate =
      mux::encode_immediate({.comm = stale, .seq = 0, .fills = true, .stripes = 1});
  auto post = [&] {
    return data.write(self_data, target.data(), 8, registration.desc(data.index()),
                      registration.remote_address(target.data() + 32),
                      registration.key(data.index()), immediate, &op);
  };
  Status status = post();
  while (status == Status::kRetry && std::chrono::steady_clock::now() < deadline) {
    lane.progress();
    status = post();
  }
  REQUIRE(status == Status::kOk);
  while ((!write.done || lane.stats().stray_remote_writes == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    lane.progress();
  }
  REQUIRE(write.done);
  CHECK(write.status == Status::kOk);
  CHECK(lane.stats().stray_remote_writes == 1);
  CHECK(fresh.types == std::vector<std::uint8_t>{kFreshType});
}

}  // namespace
}  // namespace loom::test

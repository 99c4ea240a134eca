// Registration in both MR modes, the MR cache, teardown order and bad input, in one process.
#include <cstdlib>
#include <cstring>

#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>

#include "loom/error.hpp"
#include "ofi/completion_queue.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "support/rails.hpp"
#include "support/two_process.hpp"
#include "util/log.hpp"

namespace loom::test {
namespace {

// The meson matrix says which MR mode the provider under test must end up in, so a provider
// that silently fell back to ordinary mode fails here instead of passing vacuously.
bool expect_endpoint_mr() {
  const char* value = std::getenv("TEST_EXPECT_ENDPOINT_MR");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Captures what loom logs at error level while it lives.
struct LogCapture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  LogCapture() {
    sink->set_level(spdlog::level::err);
    util::log().sinks().push_back(sink);
  }
  ~LogCapture() { util::log().sinks().pop_back(); }
  std::string text() const {
    std::string all;
    for (auto& line : sink->last_formatted()) all += line;
    return all;
  }
};

}  // namespace

TEST_CASE("registration: once per domain, or once per endpoint under FI_MR_ENDPOINT", "[local]") {
  TestFabric fabric(2, 1);
  REQUIRE(fabric.nic().endpoint_mr == expect_endpoint_mr());
  std::vector<std::byte> buffer(100000);
  ofi::MemoryRegistration registration(ofi::registration_targets(fabric.rails->rails()),
                                       buffer.data(), buffer.size());
  if (fabric.nic().endpoint_mr) {
    CHECK(registration.registrations() == 3);  // 2 data + 1 control endpoint
  } else {
    CHECK(registration.registrations() == fabric.nics.size());
  }
  for (ofi::Rail* rail : fabric.rails->rails()) CHECK(registration.covers_rail(rail->index()));
  CHECK(registration.contains(buffer.data() + 10, 100));
  CHECK_FALSE(registration.contains(buffer.data() + buffer.size() - 1, 2));
  CHECK(registration.remote_address(buffer.data() + 5) ==
        (fabric.nic().virt_addr ? reinterpret_cast<std::uintptr_t>(buffer.data() + 5) : 5u));
}

TEST_CASE("mr cache: shared by concurrent users of the same pages, closed with the last",
          "[local]") {
  TestFabric fabric(1, 1, /*cache_entries=*/2);
  ofi::RegistrationTable& cache = fabric.rails->registration_table();
  const std::size_t page = 4096;
  std::vector<std::byte> memory(8 * page);
  auto* a = reinterpret_cast<std::byte*>(
      (reinterpret_cast<std::uintptr_t>(memory.data()) + page - 1) & ~(page - 1));

  auto& first = cache.acquire(a + 10, 100);
  CHECK(cache.stats().misses == 1);
  auto& again = cache.acquire(a + 200, 50);  // same page, in use: the same registration
  CHECK(&again == &first);
  CHECK(cache.stats().hits == 1);
  CHECK(first.contains(a, page));

  auto& second = cache.acquire(a + 2 * page, page);
  CHECK(cache.stats().misses == 2);
  CHECK(&second != &first);
  auto& third = cache.acquire(a + 4 * page, 3 * page);  // beyond the soft bound: still served
  CHECK(cache.stats().entries == 3);
  CHECK(cache.stats().registrations == 3 * first.registrations());
  cache.release(first);
  CHECK(cache.stats().entries == 3);  // `again` still uses it
  cache.release(again);
  cache.release(second);
  cache.release(third);
  // No user left: nothing stays registered, and the same pages are registered anew.
  CHECK(cache.stats().in_use == 0);
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().registrations == 0);
  CHECK(cache.stats().bytes == 0);
  auto& fresh = cache.acquire(a, 10);
  CHECK(cache.stats().misses == 4);
  CHECK(cache.stats().hits == 1);
  cache.release(fresh);
}

TEST_CASE("teardown: registrations close before their endpoints", "[local]") {
  LogCapture capture;
  {
    TestFabric fabric(2, 1);
    std::vector<std::byte> buffer(4096);
    auto& mr = fabric.rails->registration_table().acquire(buffer.data(), buffer.size());
    (void)mr;  // still referenced when the rail set goes: the owner order must still hold
  }
  INFO(capture.text());
  CHECK(capture.text().find("fi_close") == std::string::npos);
}

TEST_CASE("teardown: the provider refuses an endpoint closed before its MRs", "[local]") {
  if (!expect_endpoint_mr()) SUCCEED("only FI_MR_ENDPOINT providers enforce the order");
  if (!expect_endpoint_mr()) return;
  // The wrong order, built on purpose in a child (it leaks the endpoint the provider refused to
  // close): proves that the provider enforces what the owners above guarantee.
  auto failure = run_pair(
      [](Channel&) {},
      [](Channel&) {
        LogCapture capture;
        std::vector<std::byte> buffer(4096);
        auto fabric = std::make_unique<TestFabric>(1, 1);
        auto registration = std::make_unique<ofi::MemoryRegistration>(
            ofi::registration_targets(fabric->rails->rails()), buffer.data(), buffer.size());
        fabric->rails.reset();  // endpoints first: wrong
        require(capture.text().find("fi_close(endpoint) failed") != std::string::npos,
                "closing an endpoint with bound MRs was not refused: " + capture.text());
      });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("completion queue sizes are clamped to the device's limit where it is known", "[local]") {
  ofi::NicAttributes nic{.domain = "mlx5_0", .max_cq_entries = 4096};
  CHECK(ofi::clamp_cq_size(nic, 64 * 1024) == 4096);  // e.g. 4 rails' depths on one NIC
  CHECK(ofi::clamp_cq_size(nic, 1000) == 1000);
  nic.max_cq_entries = 0;  // not known: as asked
  CHECK(ofi::clamp_cq_size(nic, 64 * 1024) == 64 * 1024);
}

TEST_CASE("bad input: registrations and rail counts", "[local]") {
  TestFabric fabric(1, 1);
  std::vector<std::byte> buffer(64);
  const auto targets = ofi::registration_targets(fabric.rails->rails());
  CHECK_THROWS_WITH(ofi::MemoryRegistration(targets, nullptr, 64),
                    Catch::Contains("register memory") && Catch::Contains("null address"));
  CHECK_THROWS_WITH(ofi::MemoryRegistration(targets, buffer.data(), 0),
                    Catch::Contains("zero-length region"));
  CHECK_THROWS_WITH(fabric.rails->registration_table().acquire(buffer.data(), 0),
                    Catch::Contains("zero-length region"));
  CHECK_THROWS_WITH(
      ofi::RailSet(fabric.nic_pointers, ofi::RailSetShape{.data_rails = 0, .control_rails = 1}),
      Catch::Contains("at least one data rail"));
  CHECK_THROWS_WITH(
      ofi::RailSet(fabric.nic_pointers, ofi::RailSetShape{.data_rails = 1, .control_rails = 0}),
      Catch::Contains("one control rail"));
  CHECK_THROWS_WITH(ofi::MemoryRegistration(targets, buffer.data(), 64, MemoryType::kCuda),
                    Catch::Contains("cuda", Catch::CaseSensitive::No));
}

TEST_CASE("bad input: unknown provider lists what exists and why it was refused", "[local]") {
  Config config = Config::from_env();
  config.provider = "no-such-provider";
  try {
    auto nics = ofi::open_nics(config);
    FAIL("open_nics accepted an unknown provider");
  } catch (const Error& e) {
    std::string text = e.what();
    INFO(text);
    CHECK(e.operation() == "select provider");
    CHECK(text.find("no-such-provider") != std::string::npos);
    CHECK(text.find("Providers found") != std::string::npos);
    CHECK(text.find("not the requested provider") != std::string::npos);
  }
  config = Config::from_env();
  config.nics = {"no-such-nic"};
  CHECK_THROWS_WITH((void)ofi::open_nics(config), Catch::Contains("no-such-nic"));
  config = Config::from_env();
  config.data_rails = 0;
  CHECK_THROWS_WITH((void)ofi::open_nics(config), Catch::Contains("LOOM_DATA_RAILS"));
}

}  // namespace loom::test

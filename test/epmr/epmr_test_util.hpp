// Helpers for the epmr provider's own tests: raw libfabric objects with owners and bounded
// waits. The forked peer and its channel are loom's test harness (support/two_process.hpp), the
// byte patterns its patterns (support/pattern.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "support/two_process.hpp"

namespace epmr_test {

using namespace std::chrono_literals;
using loom::test::Channel;

inline constexpr uint64_t kMrModeAll =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
inline constexpr uint64_t kCaps =
    FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
inline constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
// Every wait in these tests ends by this; loopback completes in microseconds.
inline constexpr auto kWaitLimit = 5s;

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// A libfabric failure in test setup, with the call and fi_strerror text.
class FabricError : public std::runtime_error {
 public:
  FabricError(const std::string& call, long rc);
  long rc() const noexcept { return rc_; }

 private:
  long rc_;
};

void check(long rc, const char* call);  // throws FabricError unless rc == 0

// The hints the library uses (all MR modes it handles), on loopback only. `prov_name` null
// leaves provider choice to libfabric (and FI_PROVIDER).
InfoPtr make_hints(uint64_t mr_mode = kMrModeAll, const char* prov_name = "epmr");
// The epmr info for 127.0.0.1 on domain "lo"; throws if epmr does not answer.
InfoPtr epmr_info();

// A fabric + domain pair. Owns both; closes domain then fabric.
class TestDomain {
 public:
  explicit TestDomain(const fi_info& info);
  ~TestDomain();
  TestDomain(const TestDomain&) = delete;
  TestDomain& operator=(const TestDomain&) = delete;

  const fi_info& info() const noexcept { return *info_; }
  fid_domain* domain() const noexcept { return domain_; }
  int close();  // explicit close, for tests that check its result

 private:
  InfoPtr info_;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
};

// A completion as the tests look at it: success entries and error entries in one queue.
struct Completion {
  fi_cq_tagged_entry entry{};
  int err = 0;  // 0, or the positive error of an error entry
  std::string err_text;
};

// An RDM endpoint with its own CQ and AV, bound and (unless asked otherwise) enabled.
class TestEndpoint {
 public:
  explicit TestEndpoint(TestDomain& domain, bool enable = true);
  ~TestEndpoint();
  TestEndpoint(const TestEndpoint&) = delete;
  TestEndpoint& operator=(const TestEndpoint&) = delete;

  fid_ep* ep() const noexcept { return ep_; }
  fid_cq* cq() const noexcept { return cq_; }
  std::vector<std::byte> name() const;
  fi_addr_t insert(const std::vector<std::byte>& peer_name);
  void enable();
  int close();  // closes the endpoint only (AV and CQ stay until destruction)

  // Moves whatever the CQ holds into this endpoint's completion queue (and so progresses it).
  void progress();
  bool has_completion() const noexcept { return !completions_.empty(); }
  Completion pop();

 private:
  void release() noexcept;

  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::deque<Completion> completions_;
};

// Waits for the next completion on `ep`, progressing `others` too (manual progress). Throws
// FabricError(-FI_ETIMEDOUT) after `limit`.
Completion wait_completion(TestEndpoint& ep, std::vector<TestEndpoint*> others = {},
                           std::chrono::milliseconds limit = kWaitLimit);
// Posts an operation, retrying while it answers -FI_EAGAIN (ofi_rxm does until a connection is
// up) and progressing `eps` in between. Returns the final result.
ssize_t post(const std::function<ssize_t()>& op, std::vector<TestEndpoint*> eps,
             std::chrono::milliseconds limit = kWaitLimit);
// Progresses all endpoints for a while; used to show that nothing arrives.
void progress_for(std::vector<TestEndpoint*> eps, std::chrono::milliseconds duration);

// A memory region that closes itself if the test did not.
class TestMr {
 public:
  TestMr(TestDomain& domain, void* buf, size_t len, uint64_t access);
  ~TestMr();
  TestMr(const TestMr&) = delete;
  TestMr& operator=(const TestMr&) = delete;

  fid_mr* mr() const noexcept { return mr_; }
  void* desc() const noexcept { return fi_mr_desc(mr_); }
  uint64_t key() const noexcept { return fi_mr_key(mr_); }
  int bind(const TestEndpoint& ep) { return fi_mr_bind(mr_, &ep.ep()->fid, 0); }
  int enable() { return fi_mr_enable(mr_); }
  void bind_and_enable(const TestEndpoint& ep);
  int close();

 private:
  fid_mr* mr_ = nullptr;
};

// Bytes that differ per message (seed) and per position, never zero: loom::test's pattern
// (support/pattern.hpp) in the byte vectors these tests hand to libfabric.
std::vector<uint8_t> pattern(uint32_t seed, size_t len);
bool matches_pattern(const uint8_t* data, uint32_t seed, size_t len);

// Progresses `ep` until the peer's next message waits on `channel` (or the peer closed it), so
// that a peer's operations on our memory (RMA, rendezvous reads) complete meanwhile.
// Completions stay queued on `ep`. Throws after `limit`.
void wait_message(Channel& channel, TestEndpoint& ep, std::chrono::milliseconds limit = kWaitLimit);

}  // namespace epmr_test

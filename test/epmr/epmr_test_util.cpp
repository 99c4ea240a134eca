#include "epmr_test_util.hpp"

#include <cstring>
#include <span>
#include <thread>

#include "support/pattern.hpp"

namespace epmr_test {
namespace {

using Clock = std::chrono::steady_clock;

char* dup_string(const char* s) {
  char* copy = strdup(s);
  if (copy == nullptr) throw std::bad_alloc();
  return copy;
}

}  // namespace

FabricError::FabricError(const std::string& call, long rc)
    : std::runtime_error(call + " failed: " + std::to_string(rc) + " (" +
                         fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)) + ")"),
      rc_(rc) {}

void check(long rc, const char* call) {
  if (rc != 0) throw FabricError(call, rc);
}

InfoPtr make_hints(uint64_t mr_mode, const char* prov_name) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw std::bad_alloc();
  hints->caps = kCaps;
  hints->mode = 0;
  hints->addr_format = FI_SOCKADDR_IN;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(mr_mode);
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  // Loopback only: tcp lists every interface and ignores this hint; epmr honours it.
  hints->domain_attr->name = dup_string("lo");
  if (prov_name != nullptr) hints->fabric_attr->prov_name = dup_string(prov_name);
  return hints;
}

InfoPtr epmr_info() {
  // Looked up once per process: fi_getinfo walks every interface and provider.
  static const InfoPtr cached = [] {
    const InfoPtr hints = make_hints();
    fi_info* list = nullptr;
    check(fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list), "fi_getinfo(epmr)");
    const InfoPtr owner(list);
    for (const fi_info* cur = list; cur != nullptr; cur = cur->next) {
      if (std::strcmp(cur->fabric_attr->prov_name, "epmr") == 0) return InfoPtr(fi_dupinfo(cur));
    }
    throw FabricError("fi_getinfo(epmr): no epmr entry", -FI_ENODATA);
  }();
  return InfoPtr(fi_dupinfo(cached.get()));
}

// ---- TestDomain ----

TestDomain::TestDomain(const fi_info& info) : info_(fi_dupinfo(&info)) {
  check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  const int rc = fi_domain(fabric_, info_.get(), &domain_, nullptr);
  if (rc != 0) {
    fi_close(&fabric_->fid);
    throw FabricError("fi_domain", rc);
  }
}

TestDomain::~TestDomain() {
  close();
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
}

int TestDomain::close() {
  if (domain_ == nullptr) return 0;
  const int rc = fi_close(&domain_->fid);
  if (rc == 0) domain_ = nullptr;
  return rc;
}

// ---- TestEndpoint ----

TestEndpoint::TestEndpoint(TestDomain& domain, bool enable_now) {
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 128;
  cq_attr.wait_obj = FI_WAIT_NONE;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  try {
    check(fi_cq_open(domain.domain(), &cq_attr, &cq_, nullptr), "fi_cq_open");
    check(fi_av_open(domain.domain(), &av_attr, &av_, nullptr), "fi_av_open");
    fi_info* info = const_cast<fi_info*>(&domain.info());
    check(fi_endpoint(domain.domain(), info, &ep_, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
    if (enable_now) enable();
  } catch (...) {
    release();
    throw;
  }
}

TestEndpoint::~TestEndpoint() {
  release();
}

void TestEndpoint::release() noexcept {
  close();
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  av_ = nullptr;
  cq_ = nullptr;
}

void TestEndpoint::enable() {
  check(fi_enable(ep_), "fi_enable");
}

int TestEndpoint::close() {
  if (ep_ == nullptr) return 0;
  const int rc = fi_close(&ep_->fid);
  if (rc == 0) ep_ = nullptr;
  return rc;
}

std::vector<std::byte> TestEndpoint::name() const {
  std::vector<std::byte> name(256);
  size_t len = name.size();
  check(fi_getname(&ep_->fid, name.data(), &len), "fi_getname");
  name.resize(len);
  return name;
}

fi_addr_t TestEndpoint::insert(const std::vector<std::byte>& peer_name) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(av_, peer_name.data(), 1, &addr, 0, nullptr);
  if (n != 1) throw FabricError("fi_av_insert", n);
  return addr;
}

void TestEndpoint::progress() {
  for (;;) {
    fi_cq_tagged_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) return;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      const ssize_t e = fi_cq_readerr(cq_, &err, 0);
      if (e != 1) throw FabricError("fi_cq_readerr", e);
      Completion c;
      c.entry.op_context = err.op_context;
      c.entry.flags = err.flags;
      c.entry.len = err.len;
      c.entry.data = err.data;
      c.entry.tag = err.tag;
      c.err = err.err;
      char buf[256] = {};
      const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
      c.err_text = std::string(fi_strerror(err.err)) + " / " + (text != nullptr ? text : "");
      completions_.push_back(c);
      continue;
    }
    if (n < 0) throw FabricError("fi_cq_read", n);
    for (ssize_t i = 0; i < n; ++i) completions_.push_back(Completion{entries[i], 0, {}});
  }
}

Completion TestEndpoint::pop() {
  Completion c = completions_.front();
  completions_.pop_front();
  return c;
}

Completion wait_completion(TestEndpoint& ep, std::vector<TestEndpoint*> others,
                           std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    ep.progress();
    if (ep.has_completion()) return ep.pop();
    for (TestEndpoint* other : others) other->progress();
    if (Clock::now() > deadline) throw FabricError("waiting for a completion", -FI_ETIMEDOUT);
    std::this_thread::yield();
  }
}

ssize_t post(const std::function<ssize_t()>& op, std::vector<TestEndpoint*> eps,
             std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const ssize_t rc = op();
    if (rc != -FI_EAGAIN || Clock::now() > deadline) return rc;
    for (TestEndpoint* ep : eps) ep->progress();
  }
}

void progress_for(std::vector<TestEndpoint*> eps, std::chrono::milliseconds duration) {
  const auto end = Clock::now() + duration;
  while (Clock::now() < end) {
    for (TestEndpoint* ep : eps) ep->progress();
    std::this_thread::sleep_for(1ms);
  }
}

// ---- TestMr ----

TestMr::TestMr(TestDomain& domain, void* buf, size_t len, uint64_t access) {
  check(fi_mr_reg(domain.domain(), buf, len, access, 0, 0, 0, &mr_, nullptr), "fi_mr_reg");
}

TestMr::~TestMr() {
  close();
}

void TestMr::bind_and_enable(const TestEndpoint& ep) {
  check(bind(ep), "fi_mr_bind");
  check(enable(), "fi_mr_enable");
}

int TestMr::close() {
  if (mr_ == nullptr) return 0;
  const int rc = fi_close(&mr_->fid);
  if (rc == 0) mr_ = nullptr;
  return rc;
}

// ---- patterns ----

std::vector<uint8_t> pattern(uint32_t seed, size_t len) {
  std::vector<uint8_t> bytes(len);
  loom::test::fill_pattern(std::as_writable_bytes(std::span(bytes)), seed);
  return bytes;
}

bool matches_pattern(const uint8_t* data, uint32_t seed, size_t len) {
  return loom::test::check_pattern(std::as_bytes(std::span(data, len)), seed).empty();
}

// ---- the peer's channel ----

void wait_message(Channel& channel, TestEndpoint& ep, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    ep.progress();
    if (channel.readable()) return;
    if (Clock::now() > deadline)
      throw std::runtime_error("channel: peer sent nothing before the deadline");
    std::this_thread::sleep_for(1ms);
  }
}

}  // namespace epmr_test

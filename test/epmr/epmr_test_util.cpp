#include "epmr_test_util.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace epmr_test {
namespace {

using Clock = std::chrono::steady_clock;

char* dup_string(const char* s) {
  char* copy = strdup(s);
  if (copy == nullptr) throw std::bad_alloc();
  return copy;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

void write_all(int fd, const void* data, size_t len) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = ::send(fd, bytes, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("socket send: ") + std::strerror(errno));
    bytes += n;
    len -= static_cast<size_t>(n);
  }
}

void read_all(int fd, void* data, size_t len, Clock::time_point deadline) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) throw std::runtime_error("socket: peer sent nothing before the deadline");
    const ssize_t n = ::recv(fd, bytes, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw std::runtime_error("socket: peer closed the connection");
    if (n < 0) throw std::runtime_error(std::string("socket recv: ") + std::strerror(errno));
    bytes += n;
    len -= static_cast<size_t>(n);
  }
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

std::vector<uint8_t> TestEndpoint::name() const {
  std::vector<uint8_t> name(256);
  size_t len = name.size();
  check(fi_getname(&ep_->fid, name.data(), &len), "fi_getname");
  name.resize(len);
  return name;
}

fi_addr_t TestEndpoint::insert(const std::vector<uint8_t>& peer_name) {
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
  for (size_t i = 0; i < len; ++i) {
    bytes[i] = static_cast<uint8_t>((i * 131 + seed * 197 + (i >> 8) * 7) % 251 + 1);
  }
  return bytes;
}

bool matches_pattern(const uint8_t* data, uint32_t seed, size_t len) {
  const std::vector<uint8_t> expected = pattern(seed, len);
  return std::memcmp(data, expected.data(), len) == 0;
}

// ---- ChildProcess ----

ChildProcess::ChildProcess(const std::function<int(int)>& body) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
  std::fflush(nullptr);  // buffered output must not be written twice
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    ::close(fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a parent that died
    // The test framework's crash handlers would report a crash here as the parent's failure;
    // the child dies plainly instead and the parent says how.
    for (const int sig : {SIGABRT, SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGTERM})
      std::signal(sig, SIG_DFL);
    int rc = 1;
    try {
      rc = body(fds[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epmr test child: %s\n", e.what());
      rc = 3;
    } catch (...) {
      rc = 4;
    }
    std::fflush(nullptr);
    ::_exit(rc);  // skip the parent's test framework and atexit handlers
  }
  ::close(fds[1]);
  socket_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (socket_ >= 0) ::close(socket_);
}

std::string ChildProcess::join(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (done < 0 && errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
    if (Clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      return "child did not exit before the deadline and was killed";
    }
    std::this_thread::sleep_for(5ms);
  }
  pid_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  if (WIFEXITED(status)) return "child exited with status " + std::to_string(WEXITSTATUS(status));
  return "child was killed by signal " + std::to_string(WTERMSIG(status));
}

// ---- socket messages ----

void send_blob(int socket, const std::vector<uint8_t>& blob) {
  const uint32_t len = static_cast<uint32_t>(blob.size());
  write_all(socket, &len, sizeof(len));
  write_all(socket, blob.data(), blob.size());
}

std::vector<uint8_t> recv_blob(int socket, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  uint32_t len = 0;
  read_all(socket, &len, sizeof(len), deadline);
  if (len > (1u << 20)) throw std::runtime_error("socket: oversized message");
  std::vector<uint8_t> blob(len);
  read_all(socket, blob.data(), len, deadline);
  return blob;
}

std::vector<uint8_t> recv_blob_progressing(int socket, TestEndpoint& ep,
                                           std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    ep.progress();
    pollfd pfd{socket, POLLIN, 0};
    if (::poll(&pfd, 1, 1) > 0)
      return recv_blob(socket, std::chrono::milliseconds(remaining_ms(deadline)));
    if (Clock::now() > deadline)
      throw std::runtime_error("socket: peer sent nothing before the deadline");
  }
}

void send_u64(int socket, uint64_t value) {
  std::vector<uint8_t> blob(sizeof(value));
  std::memcpy(blob.data(), &value, sizeof(value));
  send_blob(socket, blob);
}

uint64_t recv_u64(int socket, std::chrono::milliseconds limit) {
  const std::vector<uint8_t> blob = recv_blob(socket, limit);
  if (blob.size() != sizeof(uint64_t)) throw std::runtime_error("socket: expected 8 bytes");
  uint64_t value = 0;
  std::memcpy(&value, blob.data(), sizeof(value));
  return value;
}

void send_status(int socket, const std::string& status) {
  send_blob(socket, std::vector<uint8_t>(status.begin(), status.end()));
}

std::string recv_status(int socket, std::chrono::milliseconds limit) {
  const std::vector<uint8_t> blob = recv_blob(socket, limit);
  return std::string(blob.begin(), blob.end());
}

}  // namespace epmr_test

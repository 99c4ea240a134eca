// The objects epmr hands to applications. Each wraps the tcp;ofi_rxm object underneath and
// forwards to it; the inner objects are opened with the user-visible fid as their context, which
// is how an EQ event naming an inner object is mapped back (see queues.cpp).
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "common.hpp"
#include "info.hpp"

namespace epmr {

class Cq;
class Domain;
class Endpoint;

class Fabric {
 public:
  using FidType = fid_fabric;
  static int open(fi_fabric_attr* attr, fid_fabric** out, void* context);
  // The epmr fabric behind a user fid, or nullptr if the fid is not one.
  static Fabric* from_user(const fid* user) noexcept;

  fid_fabric* inner() const noexcept { return inner_.get(); }
  fid* user() noexcept { return &handle_.fid.fid; }
  int close() noexcept;

 private:
  explicit Fabric(void* context) noexcept;
  Handle<fid_fabric, Fabric> handle_;
  Inner<fid_fabric> inner_;
};

class Domain {
 public:
  using FidType = fid_domain;
  static int open(Fabric& fabric, fi_info* info, fid_domain** out, void* context);
  static Domain* from_user(const fid* user) noexcept;

  fid_domain* inner() const noexcept { return inner_.get(); }
  fid* user() noexcept { return &handle_.fid.fid; }
  const InnerView& inner_view() const noexcept { return view_; }
  size_t mr_iov_limit() const noexcept { return mr_iov_limit_; }
  int close() noexcept;

  // Keys for inner providers that take the application's key (tcp;ofi_rxm does): unique in the
  // domain and handed out in order at fi_mr_enable, which the tests rely on to aim at a key
  // that does not exist yet.
  uint64_t next_key() noexcept { return next_key_.fetch_add(1, std::memory_order_relaxed); }
  void mr_opened() noexcept { open_mrs_.fetch_add(1, std::memory_order_relaxed); }
  void mr_closed() noexcept { open_mrs_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  explicit Domain(void* context) noexcept;
  static constexpr uint64_t kFirstKey = 0x6570'0000'0000'0001ULL;

  Handle<fid_domain, Domain> handle_;
  InnerView view_;
  size_t mr_iov_limit_ = 1;
  Inner<fid_domain> inner_;
  std::atomic<uint64_t> next_key_{kFirstKey};
  // Disabled MRs have no inner registration, so tcp;ofi_rxm cannot see them keep the domain busy.
  std::atomic<int> open_mrs_{0};
};

class Endpoint {
 public:
  using FidType = fid_ep;
  static int open(Domain& domain, fi_info* info, fid_ep** out, void* context, uint64_t flags);
  static Endpoint* from_user(const fid* user) noexcept;

  fid_ep* inner() const noexcept { return inner_.get(); }
  fid* user() noexcept { return &handle_.fid.fid; }
  Domain& domain() const noexcept { return *domain_; }
  bool enabled() const noexcept { return enabled_.load(std::memory_order_acquire); }

  // An MR binding counts against the endpoint; false once the endpoint is closing.
  bool attach_mr() noexcept;
  void detach_mr() noexcept;

  int close() noexcept;
  int bind(fid* bfid, uint64_t flags) noexcept;
  int control(int command, void* arg) noexcept;
  int cancel(void* context) noexcept;

  // Test knobs (Knobs) on untagged receives: the error to fail this one with, or 0 to post it.
  // A refused context is remembered until it is posted, so that fi_cancel of it answers
  // -FI_ENOENT, as providers do for a receive they do not hold.
  int recv_fault(void* context) noexcept;
  void recv_posted(void* context) noexcept;
  // FI_EPMR_FAIL_TINJECT_EVERY: -FI_EAGAIN for every n-th tagged inject, else 0.
  int tinject_fault() noexcept;
  // FI_EPMR_RX_CQ_DATA: the CQ that keeps this endpoint's zero-length receives as credits for
  // remote CQ data, or nullptr.
  Cq* credit_cq() const noexcept { return credit_cq_; }

 private:
  Endpoint(Domain& domain, void* context) noexcept;
  Handle<fid_ep, Endpoint> handle_;
  Domain* domain_;
  Inner<fid_ep> inner_;
  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  int bound_mrs_ = 0;                 // guarded by mutex_
  bool closing_ = false;              // guarded by mutex_
  size_t recvs_ = 0;                  // guarded by mutex_
  size_t reposts_ = 0;                // guarded by mutex_
  std::unordered_set<void*> posted_;  // guarded by mutex_: contexts ever posted
  std::vector<void*> refused_;        // guarded by mutex_
  Cq* credit_cq_ = nullptr;           // set by fi_ep_bind(cq, FI_RECV) under FI_EPMR_RX_CQ_DATA
  std::atomic<size_t> tinjects_{0};
};

// Operation tables of the endpoint data path (endpoint_datapath.cpp).
fi_ops_msg* msg_ops() noexcept;
fi_ops_tagged* tagged_ops() noexcept;
fi_ops_rma* rma_ops() noexcept;

class Mr {
 public:
  using FidType = fid_mr;
  static int reg(Domain& domain, const fi_mr_attr& attr, uint64_t flags, fid_mr** out);

  // The data-path check: `desc` may be used on `ep` only if it is an epmr MR that is bound to
  // `ep` and enabled. One atomic load, no lookup: the descriptor is the Mr itself.
  static bool translate(void* desc, const Endpoint& ep, void*& inner_desc) noexcept {
    const auto* mr = static_cast<const Mr*>(desc);
    if (mr->magic_ != kMagic || mr->active_ep_.load(std::memory_order_acquire) != &ep) return false;
    inner_desc = mr->inner_desc_;
    return true;
  }

  int close() noexcept;
  int bind(fid* bfid, uint64_t flags) noexcept;
  int enable() noexcept;

 private:
  static constexpr uint64_t kMagic = 0x6570'6d72'5f6d'7231ULL;  // "epmr_mr1"

  Mr(Domain& domain, const fi_mr_attr& attr, uint64_t flags);

  uint64_t magic_ = kMagic;  // first, so a stray pointer is rejected on the first word read
  Handle<fid_mr, Mr> handle_;
  Domain* domain_;
  // Registration parameters, replayed into tcp;ofi_rxm at fi_mr_enable.
  std::vector<iovec> iov_;
  std::vector<uint8_t> auth_key_;
  fi_mr_attr attr_;
  uint64_t flags_;
  std::mutex mutex_;
  Endpoint* bound_ep_ = nullptr;  // guarded by mutex_
  Inner<fid_mr> inner_;           // guarded by mutex_; exists only once enabled
  void* inner_desc_ = nullptr;    // written before active_ep_ is published
  std::atomic<const Endpoint*> active_ep_{nullptr};
};

class Cq {
 public:
  using FidType = fid_cq;
  static int open(Domain& domain, fi_cq_attr* attr, fid_cq** out, void* context);
  static Cq* from_user(const fid* user) noexcept;
  fid_cq* inner() const noexcept { return inner_.get(); }
  const Domain& domain() const noexcept { return *domain_; }
  int close() noexcept;

  // FI_EPMR_RX_CQ_DATA (rx_cq_data.cpp): zero-length untagged receives posted on endpoints
  // that receive into this CQ are credits; a remote write with CQ data is reported only once it
  // consumed one, with that receive's context, and waits here until one is posted.
  bool emulates_rx_cq_data() const noexcept { return entry_size_ != 0; }
  int add_credit(const Endpoint& ep, void* context) noexcept;
  bool remove_credit(const Endpoint& ep, void* context) noexcept;
  void drop_credits(const Endpoint& ep) noexcept;
  ssize_t read(void* buf, size_t count, fi_addr_t* src) noexcept;

 private:
  struct Credit {
    const Endpoint* ep;
    void* context;
  };
  struct Held {
    fi_cq_tagged_entry entry;
    fi_addr_t src;
  };

  Cq(Domain& domain, void* context) noexcept;
  Handle<fid_cq, Cq> handle_;
  Domain* domain_;
  Inner<fid_cq> inner_;
  size_t entry_size_ = 0;  // bytes per entry when emulating FI_RX_CQ_DATA, else 0
  std::mutex credits_mutex_;
  std::deque<Credit> credits_;  // guarded by credits_mutex_
  std::deque<Held> held_;       // guarded by credits_mutex_: remote writes waiting for a credit
};

class Av {
 public:
  using FidType = fid_av;
  static int open(Domain& domain, fi_av_attr* attr, fid_av** out, void* context);
  static Av* from_user(const fid* user) noexcept;
  fid_av* inner() const noexcept { return inner_.get(); }
  const Domain& domain() const noexcept { return *domain_; }
  int close() noexcept;
  int bind(fid* bfid, uint64_t flags) noexcept;

 private:
  Av(Domain& domain, void* context) noexcept;
  Handle<fid_av, Av> handle_;
  Domain* domain_;
  Inner<fid_av> inner_;
};

class Cntr {
 public:
  using FidType = fid_cntr;
  static int open(Domain& domain, fi_cntr_attr* attr, fid_cntr** out, void* context);
  static Cntr* from_user(const fid* user) noexcept;
  fid_cntr* inner() const noexcept { return inner_.get(); }
  const Domain& domain() const noexcept { return *domain_; }
  int close() noexcept;

 private:
  Cntr(Domain& domain, void* context) noexcept;
  Handle<fid_cntr, Cntr> handle_;
  Domain* domain_;
  Inner<fid_cntr> inner_;
};

class Eq {
 public:
  using FidType = fid_eq;
  static int open(Fabric& fabric, fi_eq_attr* attr, fid_eq** out, void* context);
  static Eq* from_user(const fid* user) noexcept;
  fid_eq* inner() const noexcept { return inner_.get(); }
  int close() noexcept;

 private:
  explicit Eq(void* context) noexcept;
  Handle<fid_eq, Eq> handle_;
  Inner<fid_eq> inner_;
};

// Bytes per entry of a CQ format whose entries carry flags (msg, data, tagged), else 0: the
// formats FI_EPMR_RX_CQ_DATA can emulate on.
size_t rx_cq_data_entry_size(fi_cq_format format) noexcept;

// The inner fid behind an epmr CQ, EQ or counter (for fi_trywait), or nullptr.
fid* inner_waitable(fid* user) noexcept;

}  // namespace epmr

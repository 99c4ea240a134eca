// Completion queues, address vectors, counters and event queues: thin forwarding wrappers.
// They exist so that fi_ep_bind() is handed epmr objects it can map to the inner ones; entries
// (completion contexts, fi_addr_t values, CQ data) pass through unchanged.
#include <new>

#include "objects.hpp"

namespace epmr {
namespace {

bool wait_set_requested(enum fi_wait_obj wait_obj) noexcept {
  return wait_obj == FI_WAIT_SET;
}

int forward_wait_control(fid* inner, int command, void* arg) {
  if (command == FI_GETWAIT || command == FI_GETWAITOBJ) return fi_control(inner, command, arg);
  return -FI_ENOSYS;
}

// ---- CQ ----

fid_cq* inner_cq(const fid_cq* cq) noexcept {
  return owner_of<Cq>(cq)->inner();
}

int cq_close(fid* f) {
  return owner_of<Cq>(f)->close();
}
int cq_control(fid* f, int command, void* arg) {
  return forward_wait_control(&owner_of<Cq>(f)->inner()->fid, command, arg);
}
ssize_t cq_read(fid_cq* cq, void* buf, size_t count) {
  Cq* owner = owner_of<Cq>(cq);
  if (owner->emulates_rx_cq_data()) return owner->read(buf, count, nullptr);
  return fi_cq_read(owner->inner(), buf, count);
}
ssize_t cq_readfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src) {
  Cq* owner = owner_of<Cq>(cq);
  if (owner->emulates_rx_cq_data()) return owner->read(buf, count, src);
  return fi_cq_readfrom(owner->inner(), buf, count, src);
}
ssize_t cq_readerr(fid_cq* cq, fi_cq_err_entry* buf, uint64_t flags) {
  return fi_cq_readerr(inner_cq(cq), buf, flags);
}
ssize_t cq_sread(fid_cq* cq, void* buf, size_t count, const void* cond, int timeout) {
  return fi_cq_sread(inner_cq(cq), buf, count, cond, timeout);
}
ssize_t cq_sreadfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src, const void* cond,
                     int timeout) {
  return fi_cq_sreadfrom(inner_cq(cq), buf, count, src, cond, timeout);
}
int cq_signal(fid_cq* cq) {
  return fi_cq_signal(inner_cq(cq));
}
const char* cq_strerror(fid_cq* cq, int prov_errno, const void* err_data, char* buf, size_t len) {
  return fi_cq_strerror(inner_cq(cq), prov_errno, err_data, buf, len);
}

fi_ops g_cq_fid_ops = {
    .size = sizeof(fi_ops),
    .close = cq_close,
    .bind = no_bind,
    .control = cq_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_cq g_cq_ops = {
    .size = sizeof(fi_ops_cq),
    .read = cq_read,
    .readfrom = cq_readfrom,
    .readerr = cq_readerr,
    .sread = cq_sread,
    .sreadfrom = cq_sreadfrom,
    .signal = cq_signal,
    .strerror = cq_strerror,
};

// ---- AV ----

fid_av* inner_av(const fid_av* av) noexcept {
  return owner_of<Av>(av)->inner();
}

int av_close(fid* f) {
  return owner_of<Av>(f)->close();
}
int av_bind(fid* f, fid* bfid, uint64_t flags) {
  return owner_of<Av>(f)->bind(bfid, flags);
}
int av_insert(fid_av* av, const void* addr, size_t count, fi_addr_t* fi_addr, uint64_t flags,
              void* context) {
  return fi_av_insert(inner_av(av), addr, count, fi_addr, flags, context);
}
int av_insertsvc(fid_av* av, const char* node, const char* service, fi_addr_t* fi_addr,
                 uint64_t flags, void* context) {
  return fi_av_insertsvc(inner_av(av), node, service, fi_addr, flags, context);
}
int av_insertsym(fid_av* av, const char* node, size_t nodecnt, const char* service, size_t svccnt,
                 fi_addr_t* fi_addr, uint64_t flags, void* context) {
  return fi_av_insertsym(inner_av(av), node, nodecnt, service, svccnt, fi_addr, flags, context);
}
int av_remove(fid_av* av, fi_addr_t* fi_addr, size_t count, uint64_t flags) {
  return fi_av_remove(inner_av(av), fi_addr, count, flags);
}
int av_lookup(fid_av* av, fi_addr_t fi_addr, void* addr, size_t* addrlen) {
  return fi_av_lookup(inner_av(av), fi_addr, addr, addrlen);
}
const char* av_straddr(fid_av* av, const void* addr, char* buf, size_t* len) {
  return fi_av_straddr(inner_av(av), addr, buf, len);
}
int av_set(fid_av*, fi_av_set_attr*, fid_av_set**, void*) {
  return -FI_ENOSYS;
}

fi_ops g_av_fid_ops = {
    .size = sizeof(fi_ops),
    .close = av_close,
    .bind = av_bind,
    .control = no_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_av g_av_ops = {
    .size = sizeof(fi_ops_av),
    .insert = av_insert,
    .insertsvc = av_insertsvc,
    .insertsym = av_insertsym,
    .remove = av_remove,
    .lookup = av_lookup,
    .straddr = av_straddr,
    .av_set = av_set,
};

// ---- counter ----

fid_cntr* inner_cntr(const fid_cntr* cntr) noexcept {
  return owner_of<Cntr>(cntr)->inner();
}

int cntr_close(fid* f) {
  return owner_of<Cntr>(f)->close();
}
int cntr_control(fid* f, int command, void* arg) {
  return forward_wait_control(&owner_of<Cntr>(f)->inner()->fid, command, arg);
}
uint64_t cntr_read(fid_cntr* c) {
  return fi_cntr_read(inner_cntr(c));
}
uint64_t cntr_readerr(fid_cntr* c) {
  return fi_cntr_readerr(inner_cntr(c));
}
int cntr_add(fid_cntr* c, uint64_t value) {
  return fi_cntr_add(inner_cntr(c), value);
}
int cntr_set(fid_cntr* c, uint64_t value) {
  return fi_cntr_set(inner_cntr(c), value);
}
int cntr_wait(fid_cntr* c, uint64_t threshold, int timeout) {
  return fi_cntr_wait(inner_cntr(c), threshold, timeout);
}
int cntr_adderr(fid_cntr* c, uint64_t value) {
  return fi_cntr_adderr(inner_cntr(c), value);
}
int cntr_seterr(fid_cntr* c, uint64_t value) {
  return fi_cntr_seterr(inner_cntr(c), value);
}

fi_ops g_cntr_fid_ops = {
    .size = sizeof(fi_ops),
    .close = cntr_close,
    .bind = no_bind,
    .control = cntr_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_cntr g_cntr_ops = {
    .size = sizeof(fi_ops_cntr),
    .read = cntr_read,
    .readerr = cntr_readerr,
    .add = cntr_add,
    .set = cntr_set,
    .wait = cntr_wait,
    .adderr = cntr_adderr,
    .seterr = cntr_seterr,
};

// ---- EQ ----

fid_eq* inner_eq(const fid_eq* eq) noexcept {
  return owner_of<Eq>(eq)->inner();
}

bool is_epmr_fid(const fid* f) noexcept {
  return Fabric::from_user(f) != nullptr || Domain::from_user(f) != nullptr ||
         Endpoint::from_user(f) != nullptr || Cq::from_user(f) != nullptr ||
         Av::from_user(f) != nullptr || Cntr::from_user(f) != nullptr ||
         Eq::from_user(f) != nullptr;
}

// Events raised by inner objects name the inner fid; its context is the epmr fid, because every
// inner object is opened with that as its context. Entries the application wrote itself (FI_NOTIFY)
// are left alone.
void map_event_fid(fid*& f) noexcept {
  if (f != nullptr && !is_epmr_fid(f)) f = static_cast<fid*>(f->context);
}

void map_event(uint32_t event, void* buf, ssize_t read) noexcept {
  if (read >= static_cast<ssize_t>(sizeof(fid*)) && buf != nullptr && event != FI_NOTIFY)
    map_event_fid(*static_cast<fid**>(buf));
}

int eq_close(fid* f) {
  return owner_of<Eq>(f)->close();
}
int eq_control(fid* f, int command, void* arg) {
  return forward_wait_control(&owner_of<Eq>(f)->inner()->fid, command, arg);
}
ssize_t eq_read(fid_eq* eq, uint32_t* event, void* buf, size_t len, uint64_t flags) {
  const ssize_t rc = fi_eq_read(inner_eq(eq), event, buf, len, flags);
  if (rc > 0 && event != nullptr) map_event(*event, buf, rc);
  return rc;
}
ssize_t eq_readerr(fid_eq* eq, fi_eq_err_entry* buf, uint64_t flags) {
  const ssize_t rc = fi_eq_readerr(inner_eq(eq), buf, flags);
  if (rc > 0 && buf != nullptr) map_event_fid(buf->fid);
  return rc;
}
ssize_t eq_write(fid_eq* eq, uint32_t event, const void* buf, size_t len, uint64_t flags) {
  return fi_eq_write(inner_eq(eq), event, buf, len, flags);
}
ssize_t eq_sread(fid_eq* eq, uint32_t* event, void* buf, size_t len, int timeout, uint64_t flags) {
  const ssize_t rc = fi_eq_sread(inner_eq(eq), event, buf, len, timeout, flags);
  if (rc > 0 && event != nullptr) map_event(*event, buf, rc);
  return rc;
}
const char* eq_strerror(fid_eq* eq, int prov_errno, const void* err_data, char* buf, size_t len) {
  return fi_eq_strerror(inner_eq(eq), prov_errno, err_data, buf, len);
}

fi_ops g_eq_fid_ops = {
    .size = sizeof(fi_ops),
    .close = eq_close,
    .bind = no_bind,
    .control = eq_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_eq g_eq_ops = {
    .size = sizeof(fi_ops_eq),
    .read = eq_read,
    .readerr = eq_readerr,
    .write = eq_write,
    .sread = eq_sread,
    .strerror = eq_strerror,
};

template <typename Owner>
Owner* checked(const fid* user, size_t fclass, const fi_ops* ops) noexcept {
  if (user == nullptr || user->fclass != fclass || user->ops != ops) return nullptr;
  return owner_of<Owner>(user);
}

}  // namespace

// ---- Cq ----

Cq::Cq(Domain& domain, void* context) noexcept : handle_{}, domain_(&domain) {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_CQ;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_cq_fid_ops;
  handle_.fid.ops = &g_cq_ops;
}

Cq* Cq::from_user(const fid* user) noexcept {
  return checked<Cq>(user, FI_CLASS_CQ, &g_cq_fid_ops);
}

int Cq::open(Domain& domain, fi_cq_attr* attr, fid_cq** out, void* context) {
  if (attr != nullptr && wait_set_requested(attr->wait_obj))
    return refuse("fi_cq_open: FI_WAIT_SET is not supported", -FI_ENOSYS);
  std::unique_ptr<Cq> cq(new (std::nothrow) Cq(domain, context));
  if (!cq) return -FI_ENOMEM;
  fid_cq* inner = nullptr;
  if (const int rc = fi_cq_open(domain.inner(), attr, &inner, &cq->handle_.fid.fid); rc != 0)
    return rc;
  cq->inner_.reset(inner);
  cq->entry_size_ = knobs().rx_cq_data && attr != nullptr ? rx_cq_data_entry_size(attr->format) : 0;
  *out = &cq.release()->handle_.fid;
  return 0;
}

int Cq::close() noexcept {
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

// ---- Av ----

Av::Av(Domain& domain, void* context) noexcept : handle_{}, domain_(&domain) {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_AV;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_av_fid_ops;
  handle_.fid.ops = &g_av_ops;
}

Av* Av::from_user(const fid* user) noexcept {
  return checked<Av>(user, FI_CLASS_AV, &g_av_fid_ops);
}

int Av::open(Domain& domain, fi_av_attr* attr, fid_av** out, void* context) {
  std::unique_ptr<Av> av(new (std::nothrow) Av(domain, context));
  if (!av) return -FI_ENOMEM;
  fid_av* inner = nullptr;
  if (const int rc = fi_av_open(domain.inner(), attr, &inner, &av->handle_.fid.fid); rc != 0)
    return rc;
  av->inner_.reset(inner);
  *out = &av.release()->handle_.fid;
  return 0;
}

int Av::close() noexcept {
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

int Av::bind(fid* bfid, uint64_t flags) noexcept {
  const Eq* eq = Eq::from_user(bfid);
  if (eq == nullptr) return refuse("fi_av_bind: not an epmr EQ");
  return fi_av_bind(inner_.get(), &eq->inner()->fid, flags);
}

// ---- Cntr ----

Cntr::Cntr(Domain& domain, void* context) noexcept : handle_{}, domain_(&domain) {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_CNTR;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_cntr_fid_ops;
  handle_.fid.ops = &g_cntr_ops;
}

Cntr* Cntr::from_user(const fid* user) noexcept {
  return checked<Cntr>(user, FI_CLASS_CNTR, &g_cntr_fid_ops);
}

int Cntr::open(Domain& domain, fi_cntr_attr* attr, fid_cntr** out, void* context) {
  if (attr != nullptr && wait_set_requested(attr->wait_obj))
    return refuse("fi_cntr_open: FI_WAIT_SET is not supported", -FI_ENOSYS);
  std::unique_ptr<Cntr> cntr(new (std::nothrow) Cntr(domain, context));
  if (!cntr) return -FI_ENOMEM;
  fid_cntr* inner = nullptr;
  if (const int rc = fi_cntr_open(domain.inner(), attr, &inner, &cntr->handle_.fid.fid); rc != 0)
    return rc;
  cntr->inner_.reset(inner);
  *out = &cntr.release()->handle_.fid;
  return 0;
}

int Cntr::close() noexcept {
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

// ---- Eq ----

Eq::Eq(void* context) noexcept : handle_{} {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_EQ;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_eq_fid_ops;
  handle_.fid.ops = &g_eq_ops;
}

Eq* Eq::from_user(const fid* user) noexcept {
  return checked<Eq>(user, FI_CLASS_EQ, &g_eq_fid_ops);
}

int Eq::open(Fabric& fabric, fi_eq_attr* attr, fid_eq** out, void* context) {
  if (attr != nullptr && wait_set_requested(attr->wait_obj))
    return refuse("fi_eq_open: FI_WAIT_SET is not supported", -FI_ENOSYS);
  std::unique_ptr<Eq> eq(new (std::nothrow) Eq(context));
  if (!eq) return -FI_ENOMEM;
  fid_eq* inner = nullptr;
  if (const int rc = fi_eq_open(fabric.inner(), attr, &inner, &eq->handle_.fid.fid); rc != 0)
    return rc;
  eq->inner_.reset(inner);
  *out = &eq.release()->handle_.fid;
  return 0;
}

int Eq::close() noexcept {
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

fid* inner_waitable(fid* user) noexcept {
  if (const Cq* cq = Cq::from_user(user)) return &cq->inner()->fid;
  if (const Eq* eq = Eq::from_user(user)) return &eq->inner()->fid;
  if (const Cntr* cntr = Cntr::from_user(user)) return &cntr->inner()->fid;
  return nullptr;
}

}  // namespace epmr

// epmr's fi_getinfo: when it answers, what it reports, and how it mirrors tcp;ofi_rxm.
#include <cstring>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "epmr_test_util.hpp"

using namespace epmr_test;

namespace {

constexpr uint64_t kEpmrMrMode = FI_MR_ENDPOINT | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL;

// Runs fi_getinfo and returns the list (possibly empty) and the return code.
struct Lookup {
  int rc = 0;
  InfoPtr list;
};

Lookup lookup(const fi_info* hints) {
  fi_info* list = nullptr;
  Lookup result;
  result.rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints, &list);
  result.list.reset(list);
  return result;
}

size_t count_provider(const fi_info* list, const char* prov_name) {
  size_t n = 0;
  for (const fi_info* cur = list; cur != nullptr; cur = cur->next) {
    if (std::strcmp(cur->fabric_attr->prov_name, prov_name) == 0) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("epmr getinfo answers hints with FI_MR_ENDPOINT and requires it", "[epmr]") {
  const InfoPtr hints = make_hints();
  const Lookup found = lookup(hints.get());
  REQUIRE(found.rc == 0);
  REQUIRE(found.list);
  for (const fi_info* cur = found.list.get(); cur != nullptr; cur = cur->next) {
    CAPTURE(cur->fabric_attr->name, cur->domain_attr->name);
    CHECK(std::string(cur->fabric_attr->prov_name) == "epmr");
    CHECK(std::string(cur->domain_attr->name) == "lo");
    CHECK(static_cast<uint64_t>(cur->domain_attr->mr_mode) == kEpmrMrMode);
    // Offsets, not virtual addresses, as in tcp;ofi_rxm.
    CHECK((cur->domain_attr->mr_mode & FI_MR_VIRT_ADDR) == 0);
    CHECK((cur->caps & kCaps) == kCaps);
    CHECK((cur->caps & FI_ATOMIC) == 0);
    CHECK(cur->domain_attr->cq_data_size == 8);
    CHECK(cur->ep_attr->type == FI_EP_RDM);
  }
}

TEST_CASE("epmr getinfo mirrors the tcp;ofi_rxm info underneath", "[epmr]") {
  const InfoPtr epmr_hints = make_hints();
  const InfoPtr inner_hints = make_hints(kMrModeAll, "tcp;ofi_rxm");
  const Lookup epmr = lookup(epmr_hints.get());
  const Lookup inner = lookup(inner_hints.get());
  REQUIRE(epmr.rc == 0);
  REQUIRE(inner.rc == 0);

  // tcp ignores the domain hint, so compare with tcp's own "lo" entries.
  std::vector<const fi_info*> inner_lo;
  for (const fi_info* cur = inner.list.get(); cur != nullptr; cur = cur->next) {
    if (std::strcmp(cur->domain_attr->name, "lo") == 0) inner_lo.push_back(cur);
  }
  size_t i = 0;
  for (const fi_info* cur = epmr.list.get(); cur != nullptr; cur = cur->next, ++i) {
    REQUIRE(i < inner_lo.size());
    const fi_info* under = inner_lo[i];
    CHECK(std::string(cur->fabric_attr->name) == under->fabric_attr->name);
    CHECK(cur->caps == (under->caps & ~static_cast<uint64_t>(FI_ATOMIC)));
    CHECK(cur->mode == under->mode);
    CHECK(cur->addr_format == under->addr_format);
    CHECK(cur->tx_attr->size == under->tx_attr->size);
    CHECK(cur->rx_attr->size == under->rx_attr->size);
    CHECK(cur->tx_attr->inject_size == under->tx_attr->inject_size);
    CHECK(cur->ep_attr->mem_tag_format == under->ep_attr->mem_tag_format);
    CHECK(cur->ep_attr->max_msg_size == under->ep_attr->max_msg_size);
    CHECK(cur->domain_attr->cq_data_size == under->domain_attr->cq_data_size);
    CHECK(cur->domain_attr->mr_key_size == under->domain_attr->mr_key_size);
    CHECK(cur->domain_attr->threading == under->domain_attr->threading);
  }
  CHECK(i == inner_lo.size());
}

TEST_CASE("epmr getinfo yields nothing for hints without FI_MR_ENDPOINT", "[epmr]") {
  SECTION("named in the hints") {
    const InfoPtr hints = make_hints(kMrModeAll & ~static_cast<uint64_t>(FI_MR_ENDPOINT));
    const Lookup found = lookup(hints.get());
    CHECK(found.rc == -FI_ENODATA);
    CHECK(count_provider(found.list.get(), "epmr") == 0);
  }
  SECTION("not named: other providers answer, epmr does not") {
    const InfoPtr hints = make_hints(kMrModeAll & ~static_cast<uint64_t>(FI_MR_ENDPOINT), nullptr);
    const Lookup found = lookup(hints.get());
    REQUIRE(found.rc == 0);
    CHECK(count_provider(found.list.get(), "tcp;ofi_rxm") > 0);
    CHECK(count_provider(found.list.get(), "epmr") == 0);
  }
  SECTION("application without FI_MR_LOCAL") {
    const InfoPtr hints = make_hints(kMrModeAll & ~static_cast<uint64_t>(FI_MR_LOCAL));
    CHECK(lookup(hints.get()).rc == -FI_ENODATA);
  }
  SECTION("legacy FI_MR_BASIC hints") {
    const InfoPtr hints = make_hints(FI_MR_BASIC);
    CHECK(lookup(hints.get()).rc == -FI_ENODATA);
  }
}

TEST_CASE("epmr getinfo offers only what it forwards", "[epmr]") {
  SECTION("atomics") {
    InfoPtr hints = make_hints();
    hints->caps |= FI_ATOMIC;
    CHECK(lookup(hints.get()).rc == -FI_ENODATA);
  }
  SECTION("connected endpoints") {
    InfoPtr hints = make_hints();
    hints->ep_attr->type = FI_EP_MSG;
    CHECK(lookup(hints.get()).rc == -FI_ENODATA);
  }
}

TEST_CASE("epmr is listed without being named in the hints", "[epmr]") {
  // Holds with FI_PROVIDER unset and with FI_PROVIDER=epmr,tcp; libfabric puts tcp;ofi_rxm
  // first, so an application that wants epmr must pick it by prov_name.
  const InfoPtr hints = make_hints(kMrModeAll, nullptr);
  const Lookup found = lookup(hints.get());
  REQUIRE(found.rc == 0);
  CHECK(count_provider(found.list.get(), "epmr") > 0);
  CHECK(count_provider(found.list.get(), "epmr;ofi_rxm") == 0);
  std::set<std::string> domains;
  for (const fi_info* cur = found.list.get(); cur != nullptr; cur = cur->next) {
    if (std::strcmp(cur->fabric_attr->prov_name, "epmr") == 0)
      domains.insert(cur->domain_attr->name);
  }
  CHECK(domains == std::set<std::string>{"lo"});
}

TEST_CASE("epmr fabric and domain open from the reported info", "[epmr]") {
  const InfoPtr info = epmr_info();
  TestDomain domain(*info);
  TestEndpoint ep(domain);
  CHECK(ep.name().size() > 0);
  CHECK(ep.close() == 0);
}

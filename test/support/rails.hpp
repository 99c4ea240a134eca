// Opening NICs and rail sets for tests, from the same LOOM_* variables users set (the meson test
// matrix sets LOOM_PROVIDER and LOOM_NICS per provider).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/config.hpp"
#include "ofi/completion.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail_set.hpp"
#include "ofi/selection.hpp"

namespace loom::test {

struct TestFabric {
  std::vector<std::unique_ptr<ofi::Nic>> nics;
  std::vector<ofi::Nic*> nic_pointers;
  std::unique_ptr<ofi::RailSet> rails;  // declared last: closes before the NICs

  TestFabric(std::size_t data_rails, std::size_t control_rails, std::size_t cache_entries = 64)
      : nics(ofi::open_nics(Config::from_env())) {
    for (auto& nic : nics) nic_pointers.push_back(nic.get());
    rails = std::make_unique<ofi::RailSet>(nic_pointers,
                                           ofi::RailSetShape{.data_rails = data_rails,
                                                             .control_rails = control_rails,
                                                             .mr_cache_entries = cache_entries});
  }
  [[nodiscard]] const ofi::NicAttributes& nic() const { return nics.front()->attributes(); }
};

// Records the completions delivered to one OpContext.
struct Tracker final : ofi::CompletionHandler {
  ofi::OpContext op{.handler = this};
  int completions = 0;
  ofi::Completion last;
  std::string error_text;

  Tracker() = default;
  Tracker(const Tracker&) = delete;
  void on_completion(ofi::OpContext&, const ofi::Completion& completion) override {
    ++completions;
    last = completion;
    error_text = std::string(completion.error_text);
    last.error_text = {};
  }
};

}  // namespace loom::test

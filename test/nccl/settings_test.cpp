// The NCCL plugin applies loom's recommended provider settings at init: each one the
// environment lacks is set before the plugin's first Context (so before libfabric's first
// fi_getinfo), one the environment sets is left as it is, and each is said at INFO through
// NCCL's logger. Loads the plugin as NCCL does (dlopen, ncclNetPlugin_v12, init, finalize).
//
// Usage: nccl_settings_test PLUGIN_SO (provider from LOOM_PROVIDER, as loom reads it). For a
// provider with recommendations: run 1 with none of them set, run 2 with the environment
// setting FI_OFI_RXM_MSG_RX_SIZE=512 (tcp;ofi_rxm's). For one without: the line saying so.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "loom/config.hpp"
#include "loom/process.hpp"
#include "nccl/abi.hpp"

namespace {

namespace abi = loom::nccl::abi;

struct Line {
  abi::LogLevel level;
  std::string text;
};
std::mutex lines_mutex;
std::vector<Line> lines;

void logger(abi::LogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char text[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  const std::lock_guard lock(lines_mutex);
  lines.push_back({level, text});
}

int failures = 0;
void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// The index of the first line containing `text`, or -1.
long find(const std::string& text) {
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (lines[i].text.find(text) != std::string::npos) return static_cast<long>(i);
  return -1;
}

// Loads the plugin, inits it (one v12 context), runs `check`, finalizes and unloads it.
template <typename Check>
void with_plugin(const char* path, Check&& check) {
  lines.clear();
  void* library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    expect(false, std::string("dlopen: ") + ::dlerror());
    return;
  }
  const auto* net = static_cast<const abi::NetV12*>(::dlsym(library, abi::kSymbolV12));
  expect(net != nullptr, "the plugin exports ncclNetPlugin_v12");
  if (net != nullptr) {
    void* context = nullptr;
    abi::CommConfig config{.trafficClass = abi::kTrafficClassUndef};
    const abi::Result result = net->init(&context, 1, &config, logger, nullptr);
    expect(result == abi::kSuccess, "init: " + std::to_string(result));
    if (result == abi::kSuccess) {
      check();
      net->finalize(context);
    }
  }
  ::dlclose(library);
}

std::string value_of(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value != nullptr ? value : "(unset)";
}

// Every "provider setting" line comes before loom opens its NICs (the first fi_getinfo, whose
// outcome loom logs as "provider ... NIC(s)"), at INFO.
void expect_before_first_context() {
  const long opened = find("NIC(s)");
  expect(opened >= 0, "loom's line about the NICs it opened is in NCCL's log");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].text.find("provider setting") == std::string::npos) continue;
    expect(static_cast<long>(i) < opened, "before the NICs were opened: " + lines[i].text);
    expect(lines[i].level == abi::kLogInfo, "at INFO: " + lines[i].text);
  }
  expect(find("recommended provider settings not in the environment") < 0,
         "loom found no recommended setting missing when its context opened");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PLUGIN_SO\n", argv[0]);
    return 2;
  }
  const char* plugin = argv[1];
  const loom::Config config = loom::Config::from_env();
  const std::vector<loom::ProviderSetting> settings = loom::recommended_provider_settings(config);
  std::printf("provider %s: %zu recommended setting(s)\n", config.provider.c_str(),
              settings.size());
  for (const auto& s : settings) ::unsetenv(s.name.c_str());

  if (settings.empty()) {
    with_plugin(plugin, [&] {
      expect(find("provider settings: loom recommends none for provider " + config.provider) >= 0,
             "the plugin says there is no setting for " + config.provider);
    });
    return failures == 0 ? 0 : 1;
  }

  // 1: none set. Each is applied, with the recommended value, and said so.
  with_plugin(plugin, [&] {
    for (const auto& s : settings) {
      expect(value_of(s.name) == s.value,
             s.name + " is " + s.value + " (" + value_of(s.name) + ")");
      expect(find("provider setting " + s.name + "=" + s.value + " applied") >= 0,
             "the plugin says it applied " + s.name);
    }
    expect_before_first_context();
  });

  // 2: the environment sets one (another value than loom's): left alone, and said so.
  const std::string kept = "FI_OFI_RXM_MSG_RX_SIZE";
  bool recommended = false;
  for (const auto& s : settings) {
    ::unsetenv(s.name.c_str());
    recommended = recommended || s.name == kept;
  }
  expect(recommended, kept + " is among loom's recommendations for " + config.provider);
  ::setenv(kept.c_str(), "512", 1);
  with_plugin(plugin, [&] {
    expect(value_of(kept) == "512", kept + " stays 512 (" + value_of(kept) + ")");
    expect(find("provider setting " + kept + " left alone: the environment sets it to 512") >= 0,
           "the plugin says it left " + kept + " alone");
    for (const auto& s : settings) {
      if (s.name == kept) continue;
      expect(value_of(s.name) == s.value,
             s.name + " is " + s.value + " (" + value_of(s.name) + ")");
      expect(find("provider setting " + s.name + "=" + s.value + " applied") >= 0,
             "the plugin says it applied " + s.name);
    }
    expect_before_first_context();
  });
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}

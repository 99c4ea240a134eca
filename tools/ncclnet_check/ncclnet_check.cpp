// ncclnet_check: drives any ncclNet plugin without a GPU. Loads the .so as NCCL does (newest
// ncclNetPlugin_vN first), prints its devices and properties, and runs conformance cases
// between 2-4 forked processes on this host, or measures bandwidth with fabtests' columns.
//
//   ncclnet_check PLUGIN.so                       # devices, then every case
//   ncclnet_check PLUGIN.so --case sizes,window   # some cases
//   ncclnet_check PLUGIN.so --bw -S l:64k,1m -W 64 --json bw.json
//   ncclnet_check PLUGIN.so --device cuda:0       # the same on GPU 0's memory (exit 77 without)
#include <cinttypes>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "ncclnet_bw.hpp"
#include "ncclnet_cases.hpp"
#include "ncclnet_cuda.hpp"

namespace ncclnet {
namespace {

std::size_t parse_size(const std::string& text) {
  const auto plus = text.find('+');
  if (plus != std::string::npos)
    return parse_size(text.substr(0, plus)) + parse_size(text.substr(plus + 1));
  if (text.empty()) throw CLI::ValidationError("empty size");
  std::size_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'k':
      scale = std::size_t{1} << 10;
      break;
    case 'm':
      scale = std::size_t{1} << 20;
      break;
    case 'g':
      scale = std::size_t{1} << 30;
      break;
    default:
      break;
  }
  if (scale != 1) digits.pop_back();
  try {
    std::size_t used = 0;
    const auto value = std::stoull(digits, &used);
    if (used != digits.size()) throw std::invalid_argument(text);
    return value * scale;
  } catch (const std::exception&) {
    throw CLI::ValidationError("bad size '" + text + "'");
  }
}

std::vector<std::size_t> parse_sizes(std::string text) {
  if (text.starts_with("l:")) text = text.substr(2);
  std::vector<std::size_t> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    sizes.push_back(parse_size(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

const char* ptr_text(int bits) {
  switch (bits) {
    case abi::kPtrHost:
      return "HOST";
    case abi::kPtrHost | abi::kPtrCuda:
      return "HOST|CUDA";
    case abi::kPtrHost | abi::kPtrCuda | abi::kPtrDmaBuf:
      return "HOST|CUDA|DMABUF";
    default:
      return "other";
  }
}

}  // namespace

void print_devices(Plugin& plugin) {
  const int n = plugin.devices();
  std::printf("%d device(s)\n", n);
  for (int d = 0; d < n; ++d) {
    const DeviceProps p = plugin.properties(d);
    std::string vdevs;
    for (const int v : p.vdevs) vdevs += (vdevs.empty() ? "" : ",") + std::to_string(v);
    std::printf(
        "device %d: %s\n"
        "  pciPath %s\n  guid 0x%016" PRIx64
        "\n  ptrSupport %s (0x%x)\n  regIsGlobal %d\n"
        "  forceFlush %d\n  speed %d Mbps\n  port %d\n  latency %.2f us\n  maxComms %d\n"
        "  maxRecvs %d\n  netDeviceType %d (version %d)\n  vProps [%s]\n  maxP2pBytes %zu\n"
        "  maxCollBytes %zu\n  maxMultiRequestSize %d\n  railId %d\n  planeId %d\n",
        d, p.name.c_str(), p.pci_path.empty() ? "(NULL)" : p.pci_path.c_str(), p.guid,
        ptr_text(p.ptr_support), p.ptr_support, p.reg_is_global, p.force_flush, p.speed, p.port,
        static_cast<double>(p.latency), p.max_comms, p.max_recvs, p.device_type, p.device_version,
        vdevs.c_str(), p.max_p2p_bytes, p.max_coll_bytes, p.max_multi_request, p.rail_id,
        p.plane_id);
  }
}

}  // namespace ncclnet

int main(int argc, char** argv) {
  using namespace ncclnet;
  CLI::App app{"ncclnet_check: conformance cases and bandwidth for any ncclNet plugin, no GPU"};
  Options options;
  BwOptions bw;
  std::string cases = "all";
  std::string sizes = "0,1,4095,64k,1m,64m+3";
  std::string bw_sizes = "l:64k,256k,1m,4m";
  std::string pin;
  std::string device = "host";
  bool list = false, devices_only = false, bandwidth = false, verbose = false;
  int timeout = 60;
  app.add_option("plugin", options.plugin, "the plugin .so (a path, or a name dlopen finds)")
      ->required();
  app.add_option("--case", cases, "cases to run, comma-separated, or 'all' (default)");
  app.add_flag("--list", list, "list the cases and exit");
  app.add_flag("--devices", devices_only, "print the devices and their properties only");
  app.add_option("--ncclnet-version", options.version, "use ncclNetPlugin_vN (8..12) only")
      ->check(CLI::Range(8, 12));
  app.add_option("--dev", options.dev, "device the cases use (default 0)");
  app.add_option("--device", device,
                 "buffers in host memory (default) or on a GPU: cuda or cuda:N (CUDA driver "
                 "memory, registered with NCCL_PTR_CUDA and through dmabufs, every receive "
                 "flushed; exit 77 where the plugin or this machine cannot); staged: host "
                 "memory handled as GPU memory is, to check the tool without a GPU");
  app.add_option("--timeout", timeout, "seconds a case may take before it fails (default 60)");
  app.add_option("--sizes", sizes, "sizes of the sizes case (k/m/g suffixes, +N)");
  app.add_option("--cycles", options.cycles, "dlopen/dlclose cycles (default 50)");
  app.add_option("--kill-peer-in", options.kill_in,
                 "rank 1 kills itself in this case (shows the error)");
  app.add_flag("-v", verbose, "print the plugin's INFO lines");
  app.add_flag("-q,--quiet", options.quiet, "only a line per case");
  app.add_flag("--leak-check", options.leak_check,
               "ASan builds: LeakSanitizer in every rank before it exits");
  app.add_flag("--bw", bandwidth, "bandwidth mode instead of the cases");
  app.add_option("-S", bw_sizes, "bandwidth sizes: N or l:a,b,c (default l:64k,256k,1m,4m)");
  app.add_option("-I", bw.iterations, "iterations per size (default 20000/2000/200 by size)");
  app.add_option("-w", bw.warmup, "warmup iterations (default 10)");
  app.add_option("-W", bw.window, "requests in flight (default 64)")->check(CLI::Range(1, 1024));
  app.add_option("--json", bw.json, "write the bandwidth figures as JSON");
  app.add_option("--pin-core", pin, "cores: the server's, then the client's (e.g. 0,1)");
  CLI11_PARSE(app, argc, argv);
  set_log_verbosity(verbose ? abi::kLogInfo : abi::kLogWarn);
  options.timeout = std::chrono::seconds(timeout);

  constexpr int kSkipped = 77;
  try {
    set_memory(parse_memory(device));
    options.sizes = parse_sizes(sizes);
    {
      // Probe in this process, then unload: the ranks load it themselves after fork.
      Plugin probe(options.plugin, options.version);
      std::printf("# plugin %s: %s, ncclNet v%d\n", options.plugin.c_str(), probe.name(),
                  probe.version());
    }
    // One rank initialises the plugin, prints the devices (not before a bandwidth run) and, for
    // GPU memory, checks that the plugin's device and this machine can have it: else exit 77.
    const auto probe = [&](bool print) {
      std::fflush(stdout);
      bool skipped = false;
      const std::string error = run_ranks(
          "devices", 1, options.timeout,
          [&](Rank&) {
            Plugin plugin(options.plugin, options.version);
            plugin.init();
            if (print) print_devices(plugin);
            const std::string line = prepare_memory(plugin, options.dev);
            if (!line.empty()) std::printf("# memory: %s\n", line.c_str());
          },
          false, &skipped);
      if (skipped) return kSkipped;
      if (!error.empty()) {
        std::fprintf(stderr, "ncclnet_check: the plugin did not initialise (%s)\n", error.c_str());
        return 2;
      }
      return 0;
    };
    if (bandwidth) {
      if (memory().separate())
        if (const int rc = probe(false); rc != 0) return rc;
      bw.plugin = options.plugin;
      bw.version = options.version;
      bw.dev = options.dev;
      bw.sizes = parse_sizes(bw_sizes);
      for (const auto core : parse_sizes(pin.empty() ? "0" : pin))
        bw.pin.push_back(static_cast<int>(core));
      if (pin.empty()) bw.pin.clear();
      const std::string error = run_bandwidth(bw);
      if (!error.empty()) {
        std::fprintf(stderr, "ncclnet_check: %s\n", error.c_str());
        return 1;
      }
      return 0;
    }
    std::vector<Case> all = single_comm_cases();
    for (auto& c : multi_comm_cases()) all.push_back(std::move(c));
    if (list) {
      for (const auto& c : all)
        std::printf("%-15s %d ranks  %s\n", c.name.c_str(), c.ranks, c.description.c_str());
      return 0;
    }
    if (const int rc = probe(true); rc != 0) return rc;
    if (devices_only) return 0;
    std::vector<const Case*> selected;
    for (const auto& c : all)
      if (cases == "all" || ("," + cases + ",").find("," + c.name + ",") != std::string::npos)
        selected.push_back(&c);
    if (selected.empty()) {
      std::fprintf(stderr, "ncclnet_check: no case named '%s' (see --list)\n", cases.c_str());
      return 2;
    }
    int failed = 0;
    for (const Case* c : selected) {
      std::printf("case %s (%d ranks): %s\n", c->name.c_str(), c->ranks, c->description.c_str());
      std::fflush(stdout);
      const auto start = Clock::now();
      const std::string error = run_ranks(
          c->name, c->ranks, options.timeout,
          [&](Rank& rank) {
            if (c->standalone) return c->standalone(rank, options);
            Plugin plugin(options.plugin, options.version);
            plugin.init();
            prepare_memory(plugin, options.dev);
            c->body(plugin, rank, options);
          },
          options.leak_check);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (error.empty()) {
        std::printf("  ok (%.2f s)\n", seconds);
      } else {
        std::printf("  FAILED (%.2f s): %s\n", seconds, error.c_str());
        ++failed;
      }
      std::fflush(stdout);
    }
    std::printf("%zu cases, %zu passed, %d failed\n", selected.size(), selected.size() - failed,
                failed);
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ncclnet_check: %s\n", e.what());
    return 2;
  }
}

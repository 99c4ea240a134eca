// A stand-in for libFuzzer where the compiler has none (gcc): runs every file of the given corpus
// directories through the target, then a fixed number of pseudo-random and mutated inputs, from
// a fixed seed so a failure repeats. On a crash the input that caused it is printed in hex.
//   replay_main [-runs=N] [-seed=S] [-max_len=N] CORPUS_DIR_OR_FILE...
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::uint8_t> current;  // the input being run, for the crash handler

void print_current(int sig) {
  static const char digits[] = "0123456789abcdef";
  const char head[] = "\nreplay_main: crashed on this input (hex):\n";
  (void)!write(2, head, sizeof head - 1);
  for (std::uint8_t b : current) {
    const char pair[2] = {digits[b >> 4], digits[b & 15]};
    (void)!write(2, pair, 2);
  }
  (void)!write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run(std::vector<std::uint8_t> input) {
  current = std::move(input);
  // An exact-size heap copy, so reading past the end is caught as it is under libFuzzer.
  std::vector<std::uint8_t> copy(current);
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
}

std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// One libFuzzer-like mutation: flip, set or insert bytes, erase, truncate, or splice two inputs.
std::vector<std::uint8_t> mutate(std::vector<std::uint8_t> in,
                                 const std::vector<std::uint8_t>& other, std::mt19937_64& rng,
                                 std::size_t max_len) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  static constexpr std::uint8_t kInteresting[] = {0, 1, 2, 4, 8, 16, 17, 96, 97, 127, 128, 255};
  const std::size_t edits = 1 + pick(4);
  for (std::size_t i = 0; i < edits; ++i) {
    switch (pick(6)) {
      case 0:
        if (!in.empty()) in[pick(in.size())] ^= static_cast<std::uint8_t>(1u << pick(8));
        break;
      case 1:
        if (!in.empty()) in[pick(in.size())] = kInteresting[pick(std::size(kInteresting))];
        break;
      case 2:
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size() + 1)), 1 + pick(8),
                  static_cast<std::uint8_t>(rng()));
        break;
      case 3:
        if (!in.empty()) in.erase(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size())));
        break;
      case 4:
        in.resize(pick(in.size() + 1));
        break;
      default: {
        const std::size_t keep = pick(in.size() + 1);
        in.resize(keep);
        in.insert(in.end(), other.begin() + static_cast<std::ptrdiff_t>(pick(other.size() + 1)),
                  other.end());
      }
    }
  }
  if (in.size() > max_len) in.resize(max_len);
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t runs = 100000, max_len = 4096;
  std::uint64_t seed = 1;
  std::vector<std::vector<std::uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-runs=", 0) == 0) {
      runs = std::stoul(arg.substr(6));
    } else if (arg.rfind("-seed=", 0) == 0) {
      seed = std::stoull(arg.substr(6));
    } else if (arg.rfind("-max_len=", 0) == 0) {
      max_len = std::stoul(arg.substr(9));
    } else if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) corpus.push_back(read_file(f));
    } else if (std::filesystem::is_regular_file(arg)) {
      corpus.push_back(read_file(arg));
    } else {
      std::fprintf(stderr, "replay_main: no such option, file or directory: %s\n", arg.c_str());
      return 2;
    }
  }
  for (int sig : {SIGABRT, SIGILL, SIGSEGV, SIGBUS, SIGFPE, SIGTRAP})
    std::signal(sig, print_current);

  for (const auto& input : corpus) run(input);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < runs; ++i) {
    if (corpus.empty() || i % 4 == 0) {
      std::vector<std::uint8_t> input(rng() % (max_len / 8 + 1));
      for (auto& b : input) b = static_cast<std::uint8_t>(rng());
      run(std::move(input));
    } else {
      run(mutate(corpus[rng() % corpus.size()], corpus[rng() % corpus.size()], rng, max_len));
    }
  }
  std::printf("replay_main: %zu corpus inputs and %zu generated inputs passed (seed %llu)\n",
              corpus.size(), runs, static_cast<unsigned long long>(seed));
  return 0;
}

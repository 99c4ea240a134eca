#include "p2p_alltoall/traffic.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <sched.h>

namespace loom::bench {
namespace {

// splitmix64's finalizer.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t pattern_key(std::uint64_t kind, std::uint64_t from, std::uint64_t to,
                          std::uint64_t index) {
  return mix(mix(mix(mix(kind) ^ from) ^ to) ^ index);
}

void fill_pattern(std::byte* data, std::size_t size, std::uint64_t key) {
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const std::uint64_t word = mix(key + i);
    std::memcpy(data + i, &word, 8);
  }
  if (i < size) {
    const std::uint64_t word = mix(key + i);
    std::memcpy(data + i, &word, size - i);
  }
}

std::size_t pattern_mismatch(const std::byte* data, std::size_t size, std::uint64_t key) {
  std::byte expected[8];
  for (std::size_t i = 0; i < size; i += 8) {
    const std::uint64_t word = mix(key + i);
    std::memcpy(expected, &word, 8);
    const std::size_t n = std::min<std::size_t>(8, size - i);
    if (std::memcmp(data + i, expected, n) == 0) continue;
    for (std::size_t b = 0; b < n; ++b) {
      if (data[i + b] != expected[b]) return i + b;
    }
  }
  return size;
}

double percentile(std::vector<double>& samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(p / 100 * static_cast<double>(samples.size()));
  const std::size_t at = rank < 1 ? 0 : static_cast<std::size_t>(rank) - 1;
  return samples[std::min(at, samples.size() - 1)];
}

void Pacer::idle() {
  sched_yield();
}

void Pacer::check() {
  const auto now = Clock::now();
  if (progressed_) {
    deadline_ = now + timeout_;
    progressed_ = false;
    return;
  }
  if (now < deadline_) return;
  std::string text =
      std::string(what_) + ": nothing moved for " + std::to_string(timeout_.count()) + " s";
  if (missing_ != 0) text += " (" + std::to_string(missing_) + " still missing)";
  throw std::runtime_error(text);
}

}  // namespace loom::bench

// WireReader and WireWriter against a plain model: the input is a buffer size, the bytes to read,
// then a program of reads and writes. Neither may touch memory outside its span (the buffers are
// exactly their size, so ASan sees it), and a failure sticks.
#include "fuzz.hpp"
#include "util/wire.hpp"

namespace {

using loom::fuzz::require;
using loom::util::WireReader;
using loom::util::WireWriter;

struct Model {
  std::size_t size;
  std::size_t used = 0;
  bool ok = true;
  // Whether n more bytes fit; marks the model failed when not.
  bool take(std::size_t n) {
    if (ok && n <= size - used) return true;
    ok = false;
    return false;
  }
};

template <typename T>
T load(std::span<const std::byte> value) {
  T v;
  std::memcpy(&v, value.data(), sizeof v);
  return v;
}

void read(WireReader& r, Model& m, std::span<const std::byte> in, std::size_t width,
          std::uint8_t op) {
  const std::size_t at = m.used;
  const bool fits = m.take(width);
  if (op % 5 == 4) {
    const auto view = r.bytes(width);
    require(fits ? view.data() == in.data() + at && view.size() == width : view.empty(),
            "bytes(n) is the next n bytes, or empty");
  } else {
    std::uint64_t v = 0;
    switch (op % 5) {
      case 0:
        v = r.u8();
        break;
      case 1:
        v = r.u16();
        break;
      case 2:
        v = r.u32();
        break;
      default:
        v = r.u64();
        break;
    }
    std::uint64_t expected = 0;
    if (fits) std::memcpy(&expected, in.data() + at, width);
    require(v == expected, "a read returns the next bytes, or zero");
  }
  if (fits) m.used += width;
  require(r.ok() == m.ok, "the reader fails exactly when a read does not fit, and stays failed");
  require(r.remaining() == (m.ok ? m.size - m.used : 0), "remaining() counts what is left");
  require(r.done() == (m.ok && m.used == m.size), "done() is everything read and nothing failed");
}

void write(WireWriter& w, Model& m, std::vector<std::byte>& expected,
           std::span<const std::byte> value, std::uint8_t op) {
  const std::size_t at = m.used;
  const bool fits = m.take(value.size());
  switch (op % 5) {
    case 0:
      w.u8(load<std::uint8_t>(value));
      break;
    case 1:
      w.u16(load<std::uint16_t>(value));
      break;
    case 2:
      w.u32(load<std::uint32_t>(value));
      break;
    case 3:
      w.u64(load<std::uint64_t>(value));
      break;
    default:
      w.bytes(value);
      break;
  }
  if (fits) {
    std::copy(value.begin(), value.end(), expected.begin() + static_cast<std::ptrdiff_t>(at));
    m.used += value.size();
  }
  require(w.ok() == m.ok, "the writer fails exactly when a write does not fit, and stays failed");
  require(w.size() == m.used, "size() counts what was written");
  const auto written = w.written();
  require(std::equal(written.begin(), written.end(), expected.begin(), expected.begin() + m.used),
          "written() holds what was written, in order");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::ByteSource source(loom::fuzz::as_bytes(data, size));
  const std::vector<std::byte> in = source.bytes(source.u8() % 64);
  std::vector<std::byte> out(source.u8() % 64);
  std::vector<std::byte> expected(out.size());
  WireReader reader(in);
  WireWriter writer(out);
  Model read_model{.size = in.size()};
  Model write_model{.size = out.size()};
  for (std::size_t step = 0; step < 64; ++step) {
    const std::uint8_t op = source.u8();
    static constexpr std::size_t kWidths[] = {1, 2, 4, 8};
    const std::size_t width = op % 5 == 4 ? source.u8() % 72 : kWidths[op % 5];
    if (op & 0x80) {
      read(reader, read_model, in, width, op);
    } else {
      const std::vector<std::byte> value = source.bytes(width);
      write(writer, write_model, expected, value, op);
    }
  }
  return 0;
}

// engine/safetensors.cpp — Hugging Face safetensors: a bounds-checked, memory-mapped reader
// (one file or an index of shards) and a streaming writer.
//
// The reader trusts nothing in a header: the length field, the JSON, every dtype, shape and
// offset pair are checked before any tensor byte is touched, and a bad file is an Error naming
// the file and the tensor. Tensor data is read straight from the mapping. The writer writes the
// whole header first (padded with spaces to 8 bytes, as the format allows), then each tensor in
// header order, into PATH.tmp; finish() fsyncs and renames. It does not write shard indexes.
#include "engine/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/size.h"
#include "engine/file_util.h"

namespace strata {
namespace {

constexpr const char* kRead = "safetensors::read";
constexpr const char* kWrite = "safetensors::write";
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  StDType dtype;
  const char* name;
  uint64_t bytes;
};
constexpr DTypeName kDTypes[] = {
    {StDType::f32, "F32", 4}, {StDType::bf16, "BF16", 2}, {StDType::f16, "F16", 2},
    {StDType::i32, "I32", 4}, {StDType::i64, "I64", 8},
};

const DTypeName& dtype_entry(StDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d;
  return kDTypes[0];
}
uint64_t element_bytes(StDType t) { return dtype_entry(t).bytes; }
const char* dtype_text(StDType t) { return dtype_entry(t).name; }
bool is_float(StDType t) { return t == StDType::f32 || t == StDType::bf16 || t == StDType::f16; }

DType float_dtype(StDType t) {
  return t == StDType::bf16 ? DType::bf16 : t == StDType::f16 ? DType::f16 : DType::f32;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("safetensors::numel", str("tensor '", name, "' has shape ", shape_text(shape)));
    n = checked_mul(n, d, [&] { return str("tensor '", name, "' shape ", shape_text(shape)); });
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct SafetensorsReader::Impl {
  struct Shard {
    fileutil::MappedFile file;
    uint64_t data_offset = 0;  // 8 + header length
  };
  struct Entry {
    TensorInfo info;
    size_t shard = 0;
    uint64_t begin = 0;  // within the shard's data section
    uint64_t end = 0;
  };
  std::string path;
  std::vector<Shard> shards;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;

  void add_shard(const std::string& file, bool keep_metadata);
  void open_index(const std::string& index_path);
  const Entry& entry(const std::string& name) const;
  const uint8_t* data(const Entry& e) const {
    const Shard& s = shards[e.shard];
    return s.file.data() + s.data_offset + e.begin;
  }
};

void SafetensorsReader::Impl::add_shard(const std::string& file, bool keep_metadata) {
  fileutil::MappedFile map(file, kRead);
  const uint64_t size = map.size();
  if (size < 8)
    fail(kRead, str(file, ": ", size, " bytes is too short for the 8-byte header length"),
         "the file is truncated or not a safetensors file");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | map.data()[i];  // little endian
  if (header_bytes > size - 8)
    fail(kRead,
         str(file, ": header length ", header_bytes, " exceeds the ", size - 8,
             " bytes that follow it"),
         "the file is truncated or not a safetensors file");
  if (header_bytes > kMaxHeaderBytes)
    fail(kRead, str(file, ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes,
                    "-byte limit"));
  const char* text = reinterpret_cast<const char*>(map.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    fail(kRead, str(file, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object())
    fail(kRead, str(file, ": header is a JSON ", header.type_name(), ", not an object"));

  const uint64_t data_bytes = size - 8 - header_bytes;
  const size_t shard_index = shards.size();
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(kRead, str(file, ": __metadata__ is not an object"));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(kRead, str(file, ": __metadata__ value '", m.key(), "' is not a string"));
        if (keep_metadata) metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      fail(kRead, str(file, ": tensor '", name, "': ", what));
    };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      bad("missing 'data_offsets' [begin, end]");
    Entry e;
    e.shard = shard_index;
    e.info.name = name;
    const std::string dtype = v["dtype"].get<std::string>();
    const DTypeName* found = nullptr;
    for (const auto& d : kDTypes)
      if (dtype == d.name) found = &d;
    if (!found) bad(str("dtype '", dtype, "' is not supported; allowed: F32, BF16, F16, I32, I64"));
    e.info.dtype = found->dtype;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad(str("shape ", v["shape"].dump(), " must hold non-negative integers"));
      if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad(str("shape ", v["shape"].dump(), " overflows int64"));
      e.info.shape.push_back(d.get<int64_t>());
    }
    // numel() as every later reader computes it (int64, checked at each step), then bytes.
    uint64_t numel = 0, nbytes = 0;
    try {
      numel = static_cast<uint64_t>(e.info.numel());
      nbytes = checked_mul(numel, found->bytes, "bytes");
    } catch (const Error&) {
      bad(str("shape ", v["shape"].dump(), " overflows: more elements or bytes than 64 bits hold"));
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(str("data_offsets ", off.dump(), " must be non-negative integers"));
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      bad(str("data_offsets [", e.begin, ", ", e.end, "] out of range; allowed: begin <= end <= ",
              data_bytes, " (the data section)"));
    if (e.end - e.begin != nbytes)
      bad(str("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
              " bytes, but ", dtype, " ", shape_text(e.info.shape), " needs ", numel, " x ",
              found->bytes, " = ", nbytes));
    auto [pos, inserted] = entries.emplace(name, std::move(e));
    if (!inserted)
      fail(kRead, str(file, ": tensor '", name, "' is also in ", shards[pos->second.shard].file.path()));
    spans.push_back({pos->second.begin, pos->second.end, &pos->first});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end)
      fail(kRead, str(file, ": tensors '", *spans[i - 1].name, "' [", spans[i - 1].begin, ", ",
                      spans[i - 1].end, ") and '", *spans[i].name, "' [", spans[i].begin, ", ",
                      spans[i].end, ") overlap"));
  }
  shards.push_back(Shard{std::move(map), 8 + header_bytes});
}

void SafetensorsReader::Impl::open_index(const std::string& index_path) {
  std::string text = fileutil::read_file(index_path, kRead);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(kRead, str(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(kRead, str(index_path, ": no \"weight_map\" object"),
         "a shard index maps each tensor name to its file: {\"weight_map\": {name: file}}");
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::set<std::string> files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      fail(kRead, str(index_path, ": weight_map['", it.key(), "'] is not a file name"));
    std::string f = it.value().get<std::string>();
    std::filesystem::path p(f);
    if (f.empty() || p.is_absolute() || std::find(p.begin(), p.end(), "..") != p.end())
      fail(kRead, str(index_path, ": weight_map['", it.key(), "'] = '", f,
                      "' is not a file name inside the index's directory"));
    files.insert(f);
  }
  if (files.empty()) fail(kRead, str(index_path, ": weight_map is empty"));
  bool first = true;
  for (const std::string& f : files) {
    add_shard((dir / f).string(), first);
    first = false;
  }
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    auto e = entries.find(it.key());
    const std::string want = (dir / it.value().get<std::string>()).string();
    if (e == entries.end() || shards[e->second.shard].file.path() != want)
      fail(kRead, str(index_path, ": tensor '", it.key(), "' is not in ", want));
  }
}

const SafetensorsReader::Impl::Entry& SafetensorsReader::Impl::entry(const std::string& name) const {
  auto it = entries.find(name);
  if (it == entries.end())
    fail(kRead, str(path, ": no tensor '", name, "' (the file has ", entries.size(), " tensors)"));
  return it->second;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  impl_->path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path single = fs::path(path) / "model.safetensors";
    fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single, ec)) impl_->add_shard(single.string(), true);
    else if (fs::exists(index, ec)) impl_->open_index(index.string());
    else
      fail(kRead, str(path, ": no model.safetensors or model.safetensors.index.json in the directory"),
           "--init-from takes a Hugging Face model directory");
  } else if (path.ends_with(".index.json")) {
    impl_->open_index(path);
  } else {
    impl_->add_shard(path, true);
  }
}

SafetensorsReader::~SafetensorsReader() = default;

bool SafetensorsReader::has(const std::string& name) const { return impl_->entries.count(name) > 0; }

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  return impl_->entry(name).info;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->entries.size());
  for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}

const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return impl_->metadata;
}

void SafetensorsReader::read_f32(const std::string& name, float* out, int64_t offset,
                                 int64_t count) const {
  const Impl::Entry& e = impl_->entry(name);
  const int64_t numel = e.info.numel();
  if (offset >= 0 && offset <= numel && count < 0) count = numel - offset;  // the rest
  if (offset < 0 || offset > numel || count < 0 || count > numel - offset)  // no offset + count
    fail(kRead, str(impl_->path, ": tensor '", name, "': ", count, " elements from ", offset,
                    " are out of range; it has ", numel));
  if (!is_float(e.info.dtype))
    fail(kRead, str(impl_->path, ": tensor '", name, "' is ", dtype_text(e.info.dtype),
                    "; read_f32 reads F32, BF16 or F16 tensors"));
  if (count == 0) return;  // `out` may be null for an empty tensor
  const uint64_t esize = element_bytes(e.info.dtype);
  const uint8_t* src = impl_->data(e) + static_cast<uint64_t>(offset) * esize;
  if (e.info.dtype == StDType::f32) {
    std::memcpy(out, src, static_cast<size_t>(count) * 4);
    return;
  }
  const DType t = float_dtype(e.info.dtype);
  if (reinterpret_cast<uintptr_t>(src) % 2 == 0) {
    convert_to_f32(t, src, out, static_cast<size_t>(count));
    return;
  }
  constexpr size_t kChunk = 4096;  // an odd header length leaves 16-bit data misaligned
  uint16_t buf[kChunk];
  for (int64_t i = 0; i < count; i += kChunk) {
    size_t n = static_cast<size_t>(std::min<int64_t>(kChunk, count - i));
    std::memcpy(buf, src + i * 2, n * 2);
    convert_to_f32(t, buf, out + i, n);
  }
}

void SafetensorsReader::read_i32(const std::string& name, int32_t* out) const {
  const Impl::Entry& e = impl_->entry(name);
  const int64_t numel = e.info.numel();
  const uint8_t* src = impl_->data(e);
  if (e.info.dtype == StDType::i32) {
    if (numel > 0) std::memcpy(out, src, static_cast<size_t>(numel) * 4);  // out may be null if 0
  } else if (e.info.dtype == StDType::i64) {
    for (int64_t i = 0; i < numel; ++i) {
      int64_t v;
      std::memcpy(&v, src + i * 8, 8);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail(kRead, str(impl_->path, ": tensor '", name, "' element ", i, " = ", v,
                        " does not fit in int32"));
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    fail(kRead, str(impl_->path, ": tensor '", name, "' is ", dtype_text(e.info.dtype),
                    "; read_i32 reads I32 or I64 tensors"));
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

struct SafetensorsWriter::Impl {
  Impl(const std::string& p, std::vector<TensorInfo> t) : path(p), file(p, kWrite), tensors(std::move(t)) {}
  std::string path;
  fileutil::AtomicFile file;
  std::vector<TensorInfo> tensors;
  size_t next = 0;
  bool finished = false;

  // The tensor expected next; an Error when `name` is not it.
  const TensorInfo& expect(const std::string& name) {
    if (finished) fail(kWrite, str(path, ": write of '", name, "' after finish()"));
    if (next >= tensors.size())
      fail(kWrite, str(path, ": tensor '", name, "' is not in the header (all ", tensors.size(),
                       " tensors are written)"));
    if (tensors[next].name != name)
      fail(kWrite, str(path, ": tensors must be written in header order: expected '",
                       tensors[next].name, "', got '", name, "'"));
    return tensors[next];
  }
};

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<TensorInfo>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      fail(kWrite, str(path, ": tensor name '", t.name, "' is empty, reserved or repeated"));
    for (int64_t d : t.shape)
      if (d < 0) fail(kWrite, str(path, ": tensor '", t.name, "' has shape ", shape_text(t.shape)));
    const uint64_t bytes = checked_mul(static_cast<uint64_t>(t.numel()), element_bytes(t.dtype),
                                       [&] { return str(path, ": tensor '", t.name, "' bytes"); });
    const uint64_t end = checked_add(offset, bytes, [&] { return str(path, ": data section"); });
    header[t.name] = {{"dtype", dtype_text(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  impl_ = std::make_unique<Impl>(path, tensors);  // creates PATH.tmp
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  impl_->file.write(length, 8);
  impl_->file.write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;  // the AtomicFile removes PATH.tmp if unfinished

void SafetensorsWriter::write_f32(const std::string& name, const float* data, int64_t count) {
  const TensorInfo& t = impl_->expect(name);
  if (count != t.numel())
    fail(kWrite, str(impl_->path, ": tensor '", name, "' ", shape_text(t.shape), " has ", t.numel(),
                     " elements, got ", count));
  if (!is_float(t.dtype))
    fail(kWrite, str(impl_->path, ": tensor '", name, "' is ", dtype_text(t.dtype),
                     "; write_f32 writes F32, BF16 or F16 tensors (use write_raw)"));
  if (t.dtype == StDType::f32) {
    impl_->file.write(data, static_cast<size_t>(count) * 4);
  } else {
    constexpr int64_t kChunk = 1 << 16;
    std::vector<uint16_t> buf(static_cast<size_t>(std::min(count, kChunk)));
    for (int64_t i = 0; i < count; i += kChunk) {
      size_t n = static_cast<size_t>(std::min(kChunk, count - i));
      convert_from_f32(float_dtype(t.dtype), data + i, buf.data(), n);
      impl_->file.write(buf.data(), n * 2);
    }
  }
  ++impl_->next;
}

void SafetensorsWriter::write_raw(const std::string& name, const void* data, uint64_t bytes) {
  const TensorInfo& t = impl_->expect(name);
  const uint64_t want = static_cast<uint64_t>(t.numel()) * element_bytes(t.dtype);  // checked at open
  if (bytes != want)
    fail(kWrite, str(impl_->path, ": tensor '", name, "' ", dtype_text(t.dtype), " ",
                     shape_text(t.shape), " needs ", want, " bytes, got ", bytes));
  impl_->file.write(data, bytes);
  ++impl_->next;
}

void SafetensorsWriter::finish() {
  if (impl_->finished) return;
  if (impl_->next != impl_->tensors.size())
    fail(kWrite, str(impl_->path, ": finish() after ", impl_->next, " of ", impl_->tensors.size(),
                     " tensors; next is '", impl_->tensors[impl_->next].name, "'"));
  impl_->file.commit();
  impl_->finished = true;
}

}  // namespace strata

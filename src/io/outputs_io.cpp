#include "io/outputs_io.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "io/safetensors.hpp"

namespace qkmla {

Tensor parse_npy(const std::vector<unsigned char>& b, const std::string& name) {
  static const unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (b.size() < 10 || std::memcmp(b.data(), magic, 6) != 0)
    throw InputError(name, "npy", "not a .npy file (bad magic)");
  const int major = b[6];
  size_t hlen, start;
  if (major == 1) {
    hlen = size_t(b[8]) | size_t(b[9]) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) throw InputError(name, "npy", "truncated header");
    hlen = size_t(b[8]) | size_t(b[9]) << 8 | size_t(b[10]) << 16 | size_t(b[11]) << 24;
    start = 12;
  } else {
    throw InputError(name, "npy", "unsupported version " + std::to_string(major));
  }
  if (hlen > b.size() - start)
    throw InputError(name, "npy", "header runs past the end of the file");
  const std::string header(b.begin() + std::ptrdiff_t(start),
                           b.begin() + std::ptrdiff_t(start + hlen));
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")))
    throw InputError(name, "npy", "no descr in header");
  const std::string descr = m[1];
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    throw InputError(name, "npy", "Fortran order is not supported");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    throw InputError(name, "npy", "no shape in header");
  Tensor t;
  const std::string dims = m[1];
  static const std::regex digits("\\d+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), digits), end; it != end; ++it) {
    if (it->str().size() > 12) throw InputError(name, "npy", "shape too large");
    t.shape.push_back(std::stoll(it->str()));
    if (t.numel() > (int64_t(1) << 40)) throw InputError(name, "npy", "shape too large");
  }
  int size;
  if (descr == "<f8")
    t.dtype = DType::F64, size = 8;
  else if (descr == "<f4")
    t.dtype = DType::F32, size = 4;
  else if (descr == "<f2")
    t.dtype = DType::F16, size = 2;
  else if (descr == "<i4")
    t.dtype = DType::I32, size = 4;
  else
    throw InputError(name, "npy",
                     "unsupported dtype '" + descr + "' (supported: <f8, <f4, <f2, <i4)");
  const uint64_t n = uint64_t(t.numel());
  const size_t data = start + hlen;
  if (b.size() - data != n * uint64_t(size))
    throw InputError(name, "npy",
                     "holds " + std::to_string(b.size() - data) + " data bytes, shape " +
                         shape_str(t.shape) + " needs " + std::to_string(n * uint64_t(size)));
  t.data.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    const unsigned char* p = b.data() + data + i * uint64_t(size);
    if (t.dtype == DType::F64)
      std::memcpy(&t.data[i], p, 8);
    else if (t.dtype == DType::F32) {
      float f;
      std::memcpy(&f, p, 4);
      t.data[i] = f;
    } else if (t.dtype == DType::I32) {
      int32_t v;
      std::memcpy(&v, p, 4);
      t.data[i] = v;
    } else {
      uint16_t u;
      std::memcpy(&u, p, 2);
      t.data[i] = decode16(DType::F16, u);
    }
  }
  return t;
}

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "file", "cannot be opened");
  return parse_npy({std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}, path);
}

std::map<std::string, Tensor> read_outputs(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw InputError(path, "file", "does not exist");
  if (!fs::is_directory(path)) return read_safetensors(path).tensors;
  std::map<std::string, Tensor> out;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".npy") out[e.path().stem().string()] = read_npy(e.path().string());
  if (out.empty()) throw InputError(path, "folder", "holds no .npy files");
  return out;
}

}  // namespace qkmla

// qkv tour's text: the chapter's worked example and claims (computed by the library, viz/tour.h)
// printed for a terminal (tools/tour.h).
#include "tour.h"

#include <cstdio>
#include <string>

namespace qkv::cli {

using Json = nlohmann::json;

namespace {
std::string vec_json(const Json& v, int digits = 4) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + (v[i].is_null() ? std::string("-inf") : fmt(v[i].get<double>(), digits));
  return s + "]";
}
}  // namespace

void print_steps(std::ostream& os, const Json& st) {
  os << "The worked example: one query, " << st["n"].get<size_t>() << " keys, Dk = " << st["dk"].get<size_t>()
     << ", Dv = " << st["dv"].get<size_t>() << "\n"
     << "  q = " << vec_json(st["q"]) << "\n";
  for (size_t j = 0; j < st["n"].get<size_t>(); ++j)
    os << "  k" << j + 1 << " = " << vec_json(st["keys"][j]) << "   v" << j + 1 << " = " << vec_json(st["values"][j])
       << (st["mask"][j].get<bool>() ? "" : "   (masked)") << "\n";
  os << "1. scores s_j = q . k_j * " << fmt(st["scale"].get<double>()) << " = " << vec_json(st["scores"]) << "\n"
     << "2. max subtracted (max = " << (st["max"].is_null() ? std::string("none") : fmt(st["max"].get<double>()))
     << "): " << vec_json(st["shifted"]) << "\n"
     << "3. exponentials " << vec_json(st["exp"]) << ", sum " << fmt(st["sum"].get<double>()) << "\n"
     << "4. weights = exp / sum = " << vec_json(st["weights"]) << "   (qkv's flash kernel: "
     << vec_json(st["qkv"]["weights"]) << ")\n"
     << "5. output z = sum_j a_j v_j = " << vec_json(st["output"], 3) << "   (qkv: " << vec_json(st["qkv"]["output"], 3)
     << ")\n";
  bool masked = false;
  for (const Json& m : st["mask"]) masked = masked || !m.get<bool>();
  if (masked)
    os << "   zeroing the masked weights after the softmax instead: " << vec_json(st["zeroed"]["weights"]) << ", sum "
       << fmt(st["zeroed"]["sum"].get<double>()) << ", output " << vec_json(st["zeroed"]["output"], 3) << "\n";
}

void print_claims(std::ostream& os, const Json& all) {
  int i = 0;
  for (const Json& c : all["claims"]) {
    os << "\n" << ++i << ". " << c["title"].get<std::string>() << (c["holds"].get<bool>() ? "" : "   [DOES NOT HOLD]")
       << "\n   " << c["claim"].get<std::string>() << "\n";
    for (const Json& l : c["lines"]) os << "   " << l.get<std::string>() << "\n";
    for (const Json& m : c["matrices"]) {
      os << "   " << m["label"].get<std::string>() << ":\n";
      for (size_t r = 0; r < m["rows"].size(); ++r) {
        os << "     " << (r < m["row_labels"].size() ? m["row_labels"][r].get<std::string>() : std::string()) << "\t";
        for (const Json& x : m["rows"][r]) {
          char b[32];
          std::snprintf(b, sizeof b, "%9.4f", x.get<double>());
          os << b;
        }
        os << "\n";
      }
    }
  }
  os << "\n" << all["note"].get<std::string>() << "\n";
}

}  // namespace qkv::cli

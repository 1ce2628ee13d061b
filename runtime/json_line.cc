#include "runtime/json_line.h"

namespace strata {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string Scalar(const OrderedJson& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, OrderedJson::error_handler_t::replace);
}

void Append(const OrderedJson& value, std::string* out) {
  if (value.is_object()) {
    out->push_back('{');
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out->append(", ");
      out->append(Scalar(OrderedJson(it.key())));
      out->append(": ");
      Append(it.value(), out);
    }
    out->push_back('}');
  } else if (value.is_array()) {
    out->push_back('[');
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out->append(", ");
      Append(*it, out);
    }
    out->push_back(']');
  } else {
    out->append(Scalar(value));
  }
}

}  // namespace

std::string JsonLine(const OrderedJson& value) {
  std::string line;
  Append(value, &line);
  return line;
}

}  // namespace strata

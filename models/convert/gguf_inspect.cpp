#include "models/convert/gguf_inspect.h"

#include "base/error.h"
#include "ggml_rp/core/quant.h"
#include "gguf/value.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace rp {

namespace {

using gguf::KV;
using gguf::Reader;
using gguf::TensorInfo;
using gguf::ValueType;

std::string strf(const char * fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < static_cast<int>(sizeof buf)) return std::string(buf, n < 0 ? 0 : static_cast<size_t>(n));
    std::string s(static_cast<size_t>(n) + 1, '\0');
    va_start(ap, fmt);
    std::vsnprintf(s.data(), s.size(), fmt, ap);
    va_end(ap);
    s.resize(static_cast<size_t>(n));
    return s;
}

// Shortest decimal text that reads back to the same float (or double).
std::string fmt_float(double v, bool single) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    char buf[40];
    for (int p = 6; p <= 17; ++p) {
        std::snprintf(buf, sizeof buf, "%.*g", p, v);
        if (single ? std::strtof(buf, nullptr) == static_cast<float>(v) : std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

// A string value quoted, with control characters escaped and long text cut.
std::string fmt_string(const std::string & s, size_t max_chars = 60) {
    std::string out = "'";
    size_t shown = 0;
    for (unsigned char ch : s) {
        if (shown >= max_chars) {
            out += "...";
            break;
        }
        if (ch == '\n') out += "\\n";
        else if (ch == '\t') out += "\\t";
        else if (ch == '\r') out += "\\r";
        else if (ch == '\\') out += "\\\\";
        else if (ch == '\'') out += "\\'";
        else if (ch < 32 || ch == 127) out += strf("\\x%02x", ch);
        else out += static_cast<char>(ch);   // UTF-8 bytes pass through
        ++shown;
    }
    return out + "'" + (s.size() > max_chars ? strf(" (%zu bytes)", s.size()) : "");
}

std::string fmt_element(ValueType t, const KV & kv, size_t i) {
    if (t == ValueType::STRING) return fmt_string(kv.strs[i]);
    if (t == ValueType::BOOL) return kv.data[i] ? "true" : "false";
    if (t == ValueType::F32 || t == ValueType::F64) return fmt_float(gguf::read_float(t, kv.data.data(), i), t == ValueType::F32);
    const gguf::IntValue v = gguf::read_int(t, kv.data.data(), i);
    return strf("%s%" PRIu64, v.negative ? "-" : "", v.magnitude);
}

std::string fmt_value(const KV & kv) {
    if (kv.type != ValueType::ARRAY) return std::string(gguf::value_type_name(kv.type)) + " " + fmt_element(kv.type, kv, 0);
    const size_t preview = kv.arr_type == ValueType::STRING ? 2 : 4;
    std::string s = strf("[%s x %" PRIu64 "] [", gguf::value_type_name(kv.arr_type), kv.count);
    for (size_t i = 0; i < kv.count && i < preview; ++i) s += (i ? ", " : "") + fmt_element(kv.arr_type, kv, i);
    if (kv.count > preview) s += ", ...";
    return s + "]";
}

std::string fmt_shape(const TensorInfo & t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += strf("%s%" PRId64, d ? ", " : "", t.ne[d]);
    return s + "]";
}

bool same_shape(const TensorInfo & a, const TensorInfo & b) {
    if (a.n_dims != b.n_dims) return false;
    for (int d = 0; d < 4; ++d)
        if (a.ne[d] != b.ne[d]) return false;
    return true;
}

// Calls fn(row_index, values) for each row of a tensor, dequantized, until fn returns false.
template <typename Fn> void for_each_row(const Reader & r, const TensorInfo & t, Fn fn) {
    if (!rp::can_dequantize(t.type))
        throw Error(strf("%s: tensor '%s' has type %s, which rp-gguf cannot dequantize", r.path().c_str(),
                             t.name.c_str(), gguf::type_name(static_cast<uint32_t>(t.type))));
    const int64_t ne0 = t.ne[0];
    if (ne0 == 0) return;
    const int64_t rows = t.nelements() / ne0;
    const size_t rb = gguf::row_bytes(t.type, ne0);
    std::vector<float> row(static_cast<size_t>(ne0));
    const uint8_t * src = r.tensor_data(t);
    for (int64_t i = 0; i < rows; ++i) {
        rp::dequantize_row(t.type, src + static_cast<size_t>(i) * rb, row.data(), ne0);
        if (!fn(i, row)) return;
    }
}

} // namespace

std::string gguf_info(const Reader & file) {
    const Reader * r = &file;

    std::string out;
    out += strf("file:      %s\n", r->path().c_str());
    out += strf("version:   GGUF v%u\n", r->version());
    out += strf("alignment: %u\n", r->alignment());
    out += strf("size:      %" PRIu64 " bytes (header, metadata and tensor info: %" PRIu64 " bytes; data section: %" PRIu64
                " bytes at offset %" PRIu64 ")\n",
                r->file_size(), r->data_offset(), r->file_size() - r->data_offset(), r->data_offset());

    size_t kw = 0;
    for (const KV & kv : r->kvs()) kw = std::max(kw, kv.key.size());
    out += strf("\nmetadata: %zu keys\n", r->kvs().size());
    for (const KV & kv : r->kvs()) out += strf("  %-*s  %s\n", static_cast<int>(kw), kv.key.c_str(), fmt_value(kv).c_str());

    size_t nw = 4;
    for (const TensorInfo & t : r->tensors()) nw = std::max(nw, t.name.size());
    out += strf("\ntensors: %zu\n", r->tensors().size());
    out += strf("  %5s  %-*s  %-7s  %-22s  %12s  %12s\n", "index", static_cast<int>(nw), "name", "type", "shape", "bytes", "offset");
    int64_t params = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->tensors().size(); ++i) {
        const TensorInfo & t = r->tensors()[i];
        out += strf("  %5zu  %-*s  %-7s  %-22s  %12" PRIu64 "  %12" PRIu64 "\n", i, static_cast<int>(nw), t.name.c_str(),
                    gguf::type_name(static_cast<uint32_t>(t.type)), fmt_shape(t).c_str(), t.nbytes, t.offset);
        params += t.nelements();   // no overflow: the reader checked each count, and the file holds the bytes
        bytes += t.nbytes;
    }
    out += strf("\ntotals: %zu tensors, %" PRId64 " parameters, %" PRIu64 " bytes\n", r->tensors().size(), params, bytes);
    return out;
}

std::string gguf_dump(const Reader & file, const std::string & tensor, int64_t n) {
    const Reader * r = &file;
    const TensorInfo * t = r->find_tensor(tensor);
    if (!t) throw Error(strf("%s: no tensor named '%s'", r->path().c_str(), tensor.c_str()));
    const int64_t total = t->nelements();
    const int64_t count = n == 0 || n > total ? total : n;

    std::string out = strf("# %s: tensor '%s' %s %s, %" PRId64 " values; first %" PRId64 ":\n", r->path().c_str(),
                           t->name.c_str(), gguf::type_name(static_cast<uint32_t>(t->type)), fmt_shape(*t).c_str(), total, count);
    int64_t done = 0;
    if (count > 0)
        for_each_row(*r, *t, [&](int64_t, const std::vector<float> & row) {
            for (size_t j = 0; j < row.size() && done < count; ++j, ++done) out += fmt_float(row[j], true) + "\n";
            return done < count;
        });
    return out;
}

std::string gguf_diff(const Reader & file_a, const Reader & file_b) {
    const Reader * ra = &file_a;
    const Reader * rb = &file_b;

    size_t nw = 6;
    for (const TensorInfo & t : ra->tensors()) nw = std::max(nw, t.name.size());
    std::string out = strf("%-*s  %-7s  %-7s  %s\n", static_cast<int>(nw), "tensor", "type A", "type B", "max|a-b|");
    std::vector<std::string> only_a, only_b, reshaped;
    double worst = 0;
    std::string worst_name;
    size_t compared = 0;
    for (const TensorInfo & ta : ra->tensors()) {
        const TensorInfo * tb = rb->find_tensor(ta.name);
        if (!tb) {
            only_a.push_back(ta.name);
            continue;
        }
        if (!same_shape(ta, *tb)) {
            reshaped.push_back(ta.name + " " + fmt_shape(ta) + " vs " + fmt_shape(*tb));
            continue;
        }
        std::string d = "n/a (type cannot be dequantized)";
        if (rp::can_dequantize(ta.type) && rp::can_dequantize(tb->type)) {
            // Dequantize B row by row alongside A.
            std::vector<float> rowb(static_cast<size_t>(tb->ne[0]));
            const size_t rbytes = gguf::row_bytes(tb->type, tb->ne[0]);
            double m = 0;
            for_each_row(*ra, ta, [&](int64_t i, const std::vector<float> & rowa) {
                rp::dequantize_row(tb->type, rb->tensor_data(*tb) + static_cast<size_t>(i) * rbytes, rowb.data(), tb->ne[0]);
                for (size_t j = 0; j < rowa.size(); ++j) {
                    const double e = std::fabs(static_cast<double>(rowa[j]) - static_cast<double>(rowb[j]));
                    if (std::isnan(e)) m = NAN;
                    else if (!std::isnan(m) && e > m) m = e;
                }
                return true;
            });
            d = fmt_float(m, false);
            ++compared;
            // NaN is the worst difference of all.
            const bool worse = std::isnan(m) ? !std::isnan(worst) : (!std::isnan(worst) && m > worst);
            if (worst_name.empty() || worse) {
                worst = m;
                worst_name = ta.name;
            }
        }
        out += strf("%-*s  %-7s  %-7s  %s\n", static_cast<int>(nw), ta.name.c_str(), gguf::type_name(static_cast<uint32_t>(ta.type)),
                    gguf::type_name(static_cast<uint32_t>(tb->type)), d.c_str());
    }
    for (const TensorInfo & tb : rb->tensors())
        if (!ra->find_tensor(tb.name)) only_b.push_back(tb.name);
    for (const std::string & s : only_a) out += "only in A: " + s + "\n";
    for (const std::string & s : only_b) out += "only in B: " + s + "\n";
    for (const std::string & s : reshaped) out += "shape mismatch: " + s + "\n";
    const std::string worst_text = compared ? fmt_float(worst, false) + " (" + worst_name + ")" : "n/a";
    out += strf("summary: %zu tensors compared, max|a-b| = %s, %zu only in A, %zu only in B, %zu shape mismatches\n",
                compared, worst_text.c_str(), only_a.size(), only_b.size(), reshaped.size());
    return out;
}

} // namespace rp

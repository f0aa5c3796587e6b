// CSV reader: a header row of column names, then one sample per line. Fields are separated by
// commas and may be double-quoted ("" escapes a quote); quoted fields do not span lines. Blank
// lines are skipped. Every column except the label column is a numeric f32 feature. Labels that
// are all non-negative integers become i32 class ids [N]; any other numeric labels f32 [N, 1].
// A NaN, an infinity or a number beyond the float32 range is refused by default, naming the line,
// row and column; NonFinitePolicy::DropRows leaves such rows out instead.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
        s.remove_suffix(1);
    }
    return s;
}

// Splits one line into fields; quoted fields are unquoted into `scratch` (a deque: its strings do
// not move as it grows, so the views stay valid until the next call). Returns false on an
// unterminated quote.
bool splitFields(std::string_view line, std::vector<std::string_view>& fields,
                 std::deque<std::string>& scratch) {
    fields.clear();
    size_t scratchUsed = 0;
    size_t i = 0;
    while (true) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        if (i < line.size() && line[i] == '"') {
            if (scratchUsed == scratch.size()) scratch.emplace_back();
            std::string& buf = scratch[scratchUsed++];
            buf.clear();
            ++i;
            bool closed = false;
            while (i < line.size()) {
                if (line[i] == '"') {
                    if (i + 1 < line.size() && line[i + 1] == '"') {
                        buf += '"';
                        i += 2;
                        continue;
                    }
                    closed = true;
                    ++i;
                    break;
                }
                buf += line[i++];
            }
            if (!closed) return false;
            while (i < line.size() && line[i] != ',') ++i;
            fields.emplace_back(buf);
        } else {
            const size_t comma = line.find(',', i);
            const size_t end = comma == std::string_view::npos ? line.size() : comma;
            fields.push_back(trim(line.substr(i, end - i)));
            i = end;
        }
        if (i >= line.size()) return true;
        ++i;  // the comma
    }
}

bool parseNumber(std::string_view s, double& out) {
    s = trim(s);
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    if (s.empty()) return false;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && ptr == s.data() + s.size();
}

std::string joinNames(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
    return s;
}

}  // namespace

Result<CsvData> readCsv(const std::string& path, const std::string& labelColumn,
                        NonFinitePolicy nonFinite) {
    std::ifstream file(path, std::ios::binary);
    if (!file) return err(path + ": cannot open: " + std::strerror(errno));
    // The text, then up to about as many bytes again of parsed values (a 2-character field "0,"
    // becomes a 4-byte float), then the tensors.
    std::error_code sizeError;
    const auto fileBytes = std::filesystem::file_size(path, sizeError);
    if (!sizeError)
        TD_RETURN_IF_ERROR(checkFileFits(
            path,
            "the text of " + formatBytes(double(fileBytes)) + " and the values parsed from it",
            4.0 * double(fileBytes)));
    std::ostringstream buffer;
    buffer << file.rdbuf();
    const std::string text = std::move(buffer).str();
    std::string_view rest(text);
    if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte order mark

    std::vector<std::string_view> fields;
    std::deque<std::string> scratch;
    std::vector<std::string> columns;
    int64_t lineNo = 0;
    auto nextLine = [&](std::string_view& line) {
        while (!rest.empty()) {
            const size_t nl = rest.find('\n');
            line = rest.substr(0, nl);
            rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
            ++lineNo;
            if (!trim(line).empty()) return true;
        }
        return false;
    };

    std::string_view line;
    if (!nextLine(line)) return err(path + ": empty file (expected a header row)");
    if (!splitFields(line, fields, scratch)) {
        return err(path + ":" + std::to_string(lineNo) + ": unterminated quote in the header");
    }
    for (std::string_view f : fields) columns.emplace_back(f);
    size_t labelIndex = columns.size();
    for (size_t c = 0; c < columns.size(); ++c) {
        if (columns[c] == labelColumn) labelIndex = c;
    }
    if (labelIndex == columns.size()) {
        return err(path + ": no label column '" + labelColumn +
                   "' (columns: " + joinNames(columns) + ")");
    }
    if (columns.size() < 2) return err(path + ": no feature columns besides '" + labelColumn + "'");

    CsvData out;
    for (size_t c = 0; c < columns.size(); ++c) {
        if (c != labelIndex) out.featureNames.push_back(columns[c]);
    }
    const auto numFeatures = static_cast<int64_t>(out.featureNames.size());
    std::vector<float> features;
    std::vector<double> labels;
    std::vector<double> row(columns.size());
    int64_t dataRow = 0;  // 1-based, counting the rows after the header (dropped ones too)
    while (nextLine(line)) {
        ++dataRow;
        const auto where = [&] { return path + ":" + std::to_string(lineNo); };
        if (!splitFields(line, fields, scratch)) return err(where() + ": unterminated quote");
        if (fields.size() != columns.size()) {
            return err(where() + ": expected " + std::to_string(columns.size()) +
                       " fields as in the header, found " + std::to_string(fields.size()));
        }
        size_t bad = row.size();  // first column whose value does not fit f32
        for (size_t c = 0; c < fields.size(); ++c) {
            double& v = row[c];
            if (!parseNumber(fields[c], v)) {
                return err(where() + ": column " + std::to_string(c + 1) + " '" + columns[c] +
                           "': '" + std::string(fields[c]) + "' is not a number");
            }
            // Every value becomes f32 (a feature, or a target): a finite double beyond the f32
            // range would turn into an infinity there.
            if (bad == row.size() && !(std::isfinite(v) && std::isfinite(static_cast<float>(v))))
                bad = c;
        }
        if (bad < row.size()) {
            if (nonFinite == NonFinitePolicy::DropRows) {
                ++out.droppedRows;
                continue;
            }
            return err(
                where() + ": row " + std::to_string(dataRow) + ", column " +
                std::to_string(bad + 1) + " '" + columns[bad] + "': '" +
                std::string(trim(fields[bad])) + "' is " +
                (std::isfinite(row[bad]) ? "beyond the float32 range" : "not a finite number") +
                " (set data.source.non_finite to \"drop_rows\" to leave such rows out)");
        }
        for (size_t c = 0; c < row.size(); ++c) {
            if (c == labelIndex) {
                labels.push_back(row[c]);
            } else {
                features.push_back(static_cast<float>(row[c]));
            }
        }
    }
    const auto n = static_cast<int64_t>(labels.size());
    if (n == 0 && out.droppedRows > 0)
        return err(path + ": every one of the " + std::to_string(out.droppedRows) +
                   " data rows holds a NaN or infinite value (non_finite \"drop_rows\" left none)");
    if (n == 0) return err(path + ": no data rows after the header");

    out.x = Tensor(DType::F32, {n, numFeatures});
    std::memcpy(out.x.raw(), features.data(), features.size() * sizeof(float));
    bool classIds = true;
    for (double v : labels) {
        if (!(v >= 0 && v <= std::numeric_limits<int32_t>::max() && v == std::floor(v))) {
            classIds = false;
            break;
        }
    }
    if (classIds) {
        out.y = Tensor(DType::I32, {n});
        for (int64_t i = 0; i < n; ++i) {
            out.y.data<int32_t>()[i] = static_cast<int32_t>(labels[static_cast<size_t>(i)]);
        }
    } else {
        out.y = Tensor(DType::F32, {n, 1});
        for (int64_t i = 0; i < n; ++i) {
            out.y.data<float>()[i] = static_cast<float>(labels[static_cast<size_t>(i)]);
        }
    }
    return out;
}

}  // namespace td

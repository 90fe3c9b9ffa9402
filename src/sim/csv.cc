#include "sim/csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace gpupool {

std::vector<std::string> SplitCsv(const std::string& line, char separator) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == separator) {
      out.push_back(std::move(cur));
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

Result<int64_t> ParseCsvInt(const std::string& s, const char* column) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end) {
    return Status::InvalidArgument(fmt::format("column '{}' is not an integer: '{}'", column, s.substr(0, 64)));
  }
  return v;
}

Result<CsvFile> CsvFile::Open(const std::string& path, const std::vector<std::string>& required,
                             char separator) {
  CsvFile f;
  f.path_ = path;
  f.separator_ = separator;
  f.in_.open(path, std::ios::binary);
  if (!f.in_) return Status::IoError(fmt::format("{}: cannot open", path));
  if (!f.ReadLine()) {
    if (!f.error_.ok()) return f.error_;
    return Status::InvalidArgument(fmt::format("{}: empty file, no header", path));
  }
  const auto names = SplitCsv(f.line_, separator);
  for (const auto& r : required) {
    auto it = std::find(names.begin(), names.end(), r);
    if (it == names.end()) return Status::InvalidArgument(fmt::format("{}:1: header has no column '{}'", path, r));
    f.index_[r] = static_cast<size_t>(it - names.begin());
  }
  for (size_t i = 0; i < names.size(); ++i) f.all_[names[i]] = i;
  f.columns_ = names.size();
  return f;
}

bool CsvFile::ReadLine() {
  line_.clear();
  std::streambuf* buf = in_.rdbuf();
  bool any = false;
  for (int c = buf->sbumpc(); c != std::char_traits<char>::eof(); c = buf->sbumpc()) {
    any = true;
    if (c == '\n') break;
    if (line_.size() >= kMaxCsvLineBytes) {
      error_ = Status::InvalidArgument(
          fmt::format("{}:{}: line longer than {} bytes", path_, line_no_ + 1, kMaxCsvLineBytes));
      return false;
    }
    line_ += static_cast<char>(c);
  }
  if (!any) return false;
  ++line_no_;
  return true;
}

bool CsvFile::Next() {
  while (ReadLine()) {
    if (!line_.empty() && line_ != "\r") {
      fields_ = SplitCsv(line_, separator_);
      return true;
    }
  }
  return false;
}

Status CsvFile::RowError(const Status& s) const {
  return Status(s.code(), fmt::format("{}:{}: {}", path_, line_no_, s.message()));
}

Status CsvFile::CheckWidth() const {
  if (fields_.size() != columns_) {
    return Status::InvalidArgument(
        fmt::format("{}:{}: {} fields, header has {}", path_, line_no_, fields_.size(), columns_));
  }
  return Status::Ok();
}

const std::string* CsvFile::GetOptional(const std::string& column) const {
  auto it = all_.find(column);
  return it == all_.end() ? nullptr : &fields_[it->second];
}

}  // namespace gpupool

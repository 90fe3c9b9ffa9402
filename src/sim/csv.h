// A reader of the traces' CSV files: a header naming the columns, then one row a line. Every
// line is bounded (kMaxCsvLineBytes) and every error names the file, the line and what is wrong;
// nothing is skipped silently. No quoting (the traces have none). Used by the trace readers only
// (the Slurm export reader, sim/job_exports.h, with '|' for the comma).
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace gpupool {

inline constexpr size_t kMaxCsvLineBytes = 64 * 1024;

// Splits on `separator`; drops '\r'.
std::vector<std::string> SplitCsv(const std::string& line, char separator = ',');
// A whole decimal integer; InvalidArgument naming the column otherwise.
Result<int64_t> ParseCsvInt(const std::string& s, const char* column);

class CsvFile {
 public:
  // Opens `path` and reads its header, which must name every column of `required`. Fields are
  // separated by `separator`.
  static Result<CsvFile> Open(const std::string& path, const std::vector<std::string>& required,
                              char separator = ',');
  // The next non-empty line. False at the end of the file, or at a line over kMaxCsvLineBytes,
  // after which error() says so.
  bool Next();
  // OK, or the line that stopped Next() early.
  const Status& error() const { return error_; }
  // `s` with "<path>:<line>: " before its message.
  Status RowError(const Status& s) const;
  // InvalidArgument when the row has another number of fields than the header.
  Status CheckWidth() const;
  const std::string& Get(const std::string& column) const { return fields_[index_.at(column)]; }
  const std::string* GetOptional(const std::string& column) const;
  // Whether the header names `column`.
  bool HasColumn(const std::string& column) const { return all_.count(column) != 0; }
  int line_no() const { return line_no_; }

 private:
  bool ReadLine();

  std::string path_;
  std::ifstream in_;
  std::string line_;
  std::vector<std::string> fields_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_map<std::string, size_t> all_;
  size_t columns_ = 0;
  char separator_ = ',';
  int line_no_ = 0;
  Status error_;
};

}  // namespace gpupool

#include "sim/job_exports.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "sim/csv.h"
#include "sim/test_files.h"

namespace gpupool {
namespace {

using testutil::TempFile;
using testutil::ReadAll;

// The GPUs of each group: "2x8+1x4".
std::string Shape(const Job& job) {
  std::string out;
  for (const TaskGroup& g : job.groups)
    out += (out.empty() ? "" : "+") + std::to_string(g.replicas) + "x" + std::to_string(g.request.gpu_count);
  return out;
}

const std::string kSacctHeader =
    "JobID|User|Account|Partition|Submit|Start|End|Elapsed|State|AllocTRES|ReqTRES|NNodes\n";

TEST(SacctExportTest, ParsesElapsedStrictly) {
  EXPECT_EQ(*ParseSlurmElapsed("00:00:03"), 3);
  EXPECT_EQ(*ParseSlurmElapsed("23:59:59"), 86399);
  EXPECT_EQ(*ParseSlurmElapsed("1-02:03:04"), 93784);
  EXPECT_EQ(*ParseSlurmElapsed("120-00:00:00"), 120 * 86400);
  EXPECT_EQ(*ParseSlurmElapsed("12:34"), 754);
  EXPECT_EQ(*ParseSlurmElapsed("00:01.500"), 2);  // a fraction rounds up
  EXPECT_EQ(*ParseSlurmElapsed("00:00.000"), 0);
  for (const char* bad : {"", "1:02:03", "24:00:00", "00:60:00", "00:00:60", "1-12:34", "-01:00:00", "1-",
                          "00:00:03.5", "00:01.", "00:01.1234567", "ab:cd", "1-1-00:00:00", "UNLIMITED",
                          "Unknown", "1234567-00:00:00", "00:00:03 ", "+0:00:03", "00-00:00:0x"}) {
    EXPECT_FALSE(ParseSlurmElapsed(bad).ok()) << bad;
  }
}

TEST(SacctExportTest, ParsesTimestampsAsPrinted) {
  EXPECT_EQ(*ParseSlurmTimestamp("2026-12-07T22:52:15"), *ParseUtcTimestamp("2026-12-07 22:52:15"));
  for (const char* bad : {"2026-12-07 22:52:15", "Unknown", "None", "2026-12-07T22:52", "2026-02-30T00:00:00",
                          "2026-12-07T22:52:15Z", ""}) {
    EXPECT_FALSE(ParseSlurmTimestamp(bad).ok()) << bad;
  }
}

TEST(SacctExportTest, CountsGpusOfATresList) {
  EXPECT_EQ(*SlurmTresGpus(""), 0);
  EXPECT_EQ(*SlurmTresGpus("billing=1,cpu=1,mem=100M,node=1"), 0);
  EXPECT_EQ(*SlurmTresGpus("billing=2,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=500M,node=1"), 2);
  EXPECT_EQ(*SlurmTresGpus("gres/gpu:a100=1,gres/gpu:v100=2"), 3);  // typed only: their sum
  EXPECT_EQ(*SlurmTresGpus("gres/gpu=4,gres/gpu:a100=1"), 4);       // the untyped item is the total
  EXPECT_EQ(*SlurmTresGpus("gres/gpumem=100G,gres/shard=4,gres/gpu=1"), 1);
  for (const char* bad : {"gres/gpu=two", "gres/gpu=-1", "gres/gpu=1.5", "cpu", "=3", "gres/gpu=",
                          "cpu=1,,mem=1", "gres/gpu=1,gres/gpu=2", "gres/gpu:=1", "gres/gpu=1234567890"}) {
    EXPECT_FALSE(SlurmTresGpus(bad).ok()) << bad;
  }
}

// Recorded on this machine from Slurm 22.05.8 with slurmdbd (data/exports/README.md): a CPU job with
// steps, typed and untyped GPU requests, an array, a failed job, a heterogeneous job cancelled while
// pending, a job still running and one cancelled while running.
TEST(SacctExportTest, ReadsARecordedExport) {
  auto read = ReadSacctJobs(testutil::ExportFile("sacct-recorded.txt"));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  const std::map<std::string, int64_t> skipped = {
      {kSkipStep, 11}, {kSkipNeverStarted, 2}, {kSkipStillRunning, 1}, {kSkipNoGpus, 2}};
  EXPECT_EQ(read->skipped, skipped);
  EXPECT_EQ(DescribeSkipped(read->skipped), "11 job step, 2 never started, 2 no GPUs, 1 still running");
  ASSERT_EQ(read->jobs.size(), 6u);
  struct Want {
    const char* name;
    int64_t arrival, duration;
    const char* shape;
    const char* tenant;
  };
  const Want want[] = {{"2", 0, 3, "1x2", "vision-lab"}, {"3", 0, 2, "1x1", "mlteam"},
                       {"4_1", 0, 1, "1x1", "mlteam"},   {"4_2", 0, 1, "1x1", "mlteam"},
                       {"12", 51, 1, "1x1", "mlteam"},   {"13", 65, 3, "1x1", "vision-lab"}};
  for (size_t i = 0; i < 6; ++i) {
    const TimedJob& j = read->jobs[i];
    EXPECT_EQ(j.name, want[i].name);
    EXPECT_EQ(j.arrival, want[i].arrival) << j.name;
    EXPECT_EQ(j.duration, want[i].duration) << j.name;
    EXPECT_EQ(Shape(j.job), want[i].shape) << j.name;
    EXPECT_EQ(j.job.tenant, want[i].tenant) << j.name;
    EXPECT_EQ(j.job.queue, "gpu") << j.name;
    EXPECT_TRUE(ValidateJob(j.job).ok()) << j.name;
  }
  // The jobs of the same session that never ran (exported with -j): nothing to replay.
  auto pending = ReadSacctJobs(testutil::ExportFile("sacct-recorded-pending.txt"));
  ASSERT_FALSE(pending.ok());
  EXPECT_NE(pending.status().message().find("no jobs to replay (skipped: 2 never started)"),
            std::string::npos)
      << pending.status().message();
}

TEST(SacctExportTest, MapsGangsQueuesAndTenantsSortedByArrival) {
  TempFile f("sacct.txt",
             kSacctHeader +
                 "100|alice|vision|gpu,debug|2024-05-01T10:00:00|2024-05-01T10:05:00|2024-05-02T12:05:00|"
                 "1-02:00:00|COMPLETED|cpu=64,gres/gpu=16,mem=1T,node=2|gres/gpu=16,node=2|2\n"
                 "100.batch||vision||2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-02T12:05:00|"
                 "1-02:00:00|COMPLETED|cpu=32,gres/gpu=8,node=1||1\n"
                 "101|bob||batch|2024-05-01T09:00:00|2024-05-01T09:00:10|2024-05-01T09:01:10|00:01:00|"
                 "TIMEOUT|cpu=4,gres/gpu:v100=1,gres/gpu:a100=2,node=1|cpu=4|1\n"
                 "102||||2024-05-01T09:30:00|2024-05-01T09:30:00|2024-05-01T09:30:00|00:00:00|FAILED|"
                 "gres/gpu=12,node=1|gres/gpu=12|1\n"
                 "103_7|carol|nlp|gpu|2024-05-01T09:30:00|2024-05-01T09:31:00|2024-05-01T09:41:00|00:10:00|"
                 "NODE_FAIL|gres/gpu=32,node=2|gres/gpu=32|2\n"
                 "104|carol|nlp|gpu|2024-05-01T11:00:00|Unknown|Unknown|00:00:00|PENDING||gres/gpu=8|1\n"
                 "105|carol|nlp|gpu|2024-05-01T11:00:00|2024-05-01T11:00:00|Unknown|00:10:00|RUNNING|"
                 "gres/gpu=1|gres/gpu=1|1\n"
                 "106|dave|nlp|cpu|2024-05-01T11:00:00|2024-05-01T11:00:00|2024-05-01T11:00:05|00:00:05|"
                 "COMPLETED|cpu=1,mem=1G,node=1|cpu=1|1\n"
                 "107+1|erin|nlp|gpu|2024-05-01T08:00:00|2024-05-01T08:00:00|2024-05-01T08:02:30|02:30|"
                 "CANCELLED by 1000|gres/gpu=1,node=1|gres/gpu=1|1\n"
                 "108|erin|nlp|gpu|2024-05-01T11:00:00|None|2024-05-01T11:00:05|00:00:00|CANCELLED by 0||"
                 "gres/gpu=1|1\n");
  auto read = ReadSacctJobs(f.path());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  const std::map<std::string, int64_t> skipped = {
      {kSkipStep, 1}, {kSkipNeverStarted, 2}, {kSkipStillRunning, 1}, {kSkipNoGpus, 1}};
  EXPECT_EQ(read->skipped, skipped);
  ASSERT_EQ(read->jobs.size(), 5u);
  const auto& j = read->jobs;
  EXPECT_EQ(j[0].name, "107+1");  // 08:00, the first arrival
  EXPECT_EQ(j[0].duration, 150);
  EXPECT_EQ(j[1].name, "101");
  EXPECT_EQ(j[1].arrival, 3600);
  EXPECT_EQ(Shape(j[1].job), "1x3");  // typed items summed
  EXPECT_EQ(j[1].job.tenant, "bob");  // no Account: the User
  EXPECT_EQ(j[1].job.queue, "batch");
  EXPECT_EQ(j[2].name, "102");  // equal Submit: file order
  EXPECT_EQ(j[2].arrival, 5400);
  EXPECT_EQ(j[2].duration, 1);            // at least a second
  EXPECT_EQ(Shape(j[2].job), "1x8+1x4");  // one node, servers of 8: as the Philly reader
  EXPECT_EQ(j[2].job.queue, "default");
  EXPECT_EQ(j[2].job.tenant, "default");
  EXPECT_EQ(j[3].name, "103_7");
  EXPECT_EQ(Shape(j[3].job), "4x8");  // two nodes of 16 GPUs: each split in two
  EXPECT_EQ(j[4].name, "100");
  EXPECT_EQ(j[4].arrival, 7200);
  EXPECT_EQ(j[4].duration, 93600);
  EXPECT_EQ(Shape(j[4].job), "2x8");  // a gang of two nodes
  EXPECT_EQ(j[4].job.gang_size(), 2);
  EXPECT_EQ(j[4].job.queue, "gpu");  // the first partition
  EXPECT_EQ(j[4].job.tenant, "vision");
  for (const TimedJob& t : j) {
    EXPECT_TRUE(ValidateJob(t.job).ok()) << t.name;
    EXPECT_EQ(t.job.groups[0].request.cpu.units(), 0) << t.name;  // GPUs only
  }
  // Servers of 4 GPUs: each node's share split into tasks of 4.
  auto small = ReadSacctJobs(f.path(), 4);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(Shape(small->jobs[4].job), "4x4");
  EXPECT_EQ(Shape(small->jobs[3].job), "8x4");
  EXPECT_FALSE(ReadSacctJobs(f.path(), 0).ok());
}

TEST(SacctExportTest, ReadsOtherColumnChoices) {
  // No AllocTRES: ReqTRES; no Start/End: Elapsed and State decide.
  TempFile elapsed("elapsed.txt",
                   "JobID|Submit|Elapsed|State|ReqTRES\n"
                   "1|2024-05-01T10:00:00|00:05:00|COMPLETED|gres/gpu=2\n"
                   "2|2024-05-01T10:00:10|00:05:00|PENDING|gres/gpu=2\n"
                   "3|2024-05-01T10:00:20|00:05:00|RUNNING|gres/gpu=2\n"
                   "4|2024-05-01T10:00:30|00:00:00|REQUEUED|gres/gpu=2\n");
  auto a = ReadSacctJobs(elapsed.path());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->jobs.size(), 1u);
  EXPECT_EQ(a->jobs[0].duration, 300);
  EXPECT_EQ(Shape(a->jobs[0].job), "1x2");
  EXPECT_EQ(a->skipped, (std::map<std::string, int64_t>{{kSkipNeverStarted, 2}, {kSkipStillRunning, 1}}));
  // No Elapsed: End - Start; no State needed; --parsable's trailing '|' is one more (empty) column.
  TempFile times("times.txt",
                 "JobID|Submit|Start|End|AllocTRES|\n"
                 "1|2024-05-01T10:00:00|2024-05-01T10:01:00|2024-05-01T11:01:00|gres/gpu=1|\n");
  auto b = ReadSacctJobs(times.path());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->jobs[0].duration, 3600);
  EXPECT_TRUE(b->skipped.empty());
}

TEST(SacctExportTest, HostileRowsAreRefusedNamingLineAndReason) {
  const std::string ok_tail =
      "|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|COMPLETED|";
  const auto row = [&](const std::string& id, const std::string& tres, const std::string& nodes = "1") {
    return id + "|u|acct|gpu" + ok_tail + tres + "|" + tres + "|" + nodes + "\n";
  };
  const std::string good = row("1", "gres/gpu=1");
  const std::pair<std::string, std::string> cases[] = {
      {"1|u|a|gpu|2024-05-01 "
       "10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|COMPLETED|gres/gpu=1||1\n",
       ":2: Submit: timestamp '2024-05-01 10:00:00' is not YYYY-MM-DDTHH:MM:SS"},
      {"1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|1:00:00|COMPLETED|gres/"
       "gpu=1||1\n",
       ":2: Elapsed '1:00:00' is not [D-]HH:MM:SS or MM:SS[.fff]"},
      {"1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T25:00:00|2024-05-01T10:01:00|00:01:00|COMPLETED|gres/"
       "gpu=1||1\n",
       ":2: Start: timestamp '2024-05-01T25:00:00'"},
      {"1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:02:00|2024-05-01T10:01:00|00:01:00|COMPLETED|gres/"
       "gpu=1||1\n",
       ":2: End 2024-05-01T10:01:00 is before Start 2024-05-01T10:02:00"},
      {"1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|99999-00:00:00|COMPLETED|gres/"
       "gpu=1||1\n",
       ":2: run time 8639913600 s is more than 315360000 s"},
      {"1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|DONE|gres/gpu=1||1\n",
       ":2: State 'DONE' is not a Slurm job state"},
      {row("1", "gres/gpu=x"), ":2: AllocTRES: TRES item 'gres/gpu=x' is not a whole number of GPUs"},
      {row("1", "gres/gpu=2000"), ":2: 2000 GPUs, more than the 1024 a job may have"},
      {row("1", "gres/gpu=3", "2"), ":2: 3 GPUs do not divide over NNodes 2"},
      {row("1", "gres/gpu=2", "0"), ":2: NNodes '0' is not a whole number of nodes"},
      {row("1", "gres/gpu=2", "two"), ":2: NNodes 'two' is not"},
      {row("", "gres/gpu=1"), ":2: JobID '' is not 1..64 printable characters"},
      {row("1 2", "gres/gpu=1"), ":2: JobID '1 2' is not"},
      {good + row("1", "gres/gpu=2"), ":3: JobID '1' is also on line 2"},
      {"1|u|acct|gpu.a" + ok_tail + "gres/gpu=1||1\n",
       ":2: Partition 'gpu.a' is not 1..63 characters of [A-Za-z0-9_-]"},
      {"1|u|a b|gpu" + ok_tail + "gres/gpu=1||1\n", ":2: Account 'a b' is not"},
      {"1|j.doe||gpu" + ok_tail + "gres/gpu=1||1\n", ":2: User 'j.doe' is not"},
      {"1|u|acct|gpu" + ok_tail + "gres/gpu=1|1\n", ":2: 11 fields, header has 12"},
      {good + "2|u|acct|gpu" + ok_tail + "gres/gpu=1||1|x\n", ":3: 13 fields, header has 12"},
      {"1|u|acct|gpu" + ok_tail + std::string(kMaxCsvLineBytes, 'a') + "||1\n", ":2: line longer than"},
  };
  for (const auto& [rows, error] : cases) {
    TempFile f("bad.txt", kSacctHeader + rows);
    auto read = ReadSacctJobs(f.path());
    ASSERT_FALSE(read.ok()) << rows.substr(0, 120);
    EXPECT_NE(read.status().message().find(f.path() + error), std::string::npos) << read.status().message();
    EXPECT_LT(read.status().message().size(), 512u);
  }
  // Any cut of the recorded export is read or refused, never thrown.
  const std::string recorded = ReadAll(testutil::ExportFile("sacct-recorded.txt"));
  for (size_t cut = 0; cut < recorded.size(); cut += 7) {
    TempFile part("cut.txt", recorded.substr(0, cut));
    (void)ReadSacctJobs(part.path());
  }
}

TEST(SacctExportTest, RefusesHeadersItCannotReadAndFilesPastTheLimits) {
  const std::pair<std::string, std::string> headers[] = {
      {"Submit|Elapsed|State|AllocTRES\n", ":1: header has no column 'JobID' (sacct --parsable2 output"},
      {"       JobID    JobName  Partition    Account  AllocCPUS      State ExitCode \n",
       ":1: header has no column 'JobID' (sacct --parsable2 output: '|'-separated"},
      {"JobID|Submit|State|AllocTRES\n", ":1: header has neither Elapsed nor both Start and End"},
      {"JobID|Submit|Start|Elapsed|AllocTRES\n", ":1: header has no State (needed without Start and End)"},
      {"JobID|Submit|Elapsed|State\n", ":1: header has neither AllocTRES nor ReqTRES"},
      {"", ": empty file, no header"},
  };
  for (const auto& [header, error] : headers) {
    TempFile f("header.txt", header);
    auto read = ReadSacctJobs(f.path());
    ASSERT_FALSE(read.ok()) << header;
    EXPECT_NE(read.status().message().find(f.path() + error), std::string::npos) << read.status().message();
  }
  EXPECT_EQ(ReadSacctJobs("/no/such/file").status().code(), StatusCode::kIoError);

  const std::string two_jobs =
      kSacctHeader +
      "1|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|"
      "COMPLETED|gres/gpu=1||1\n"
      "1.0|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|"
      "COMPLETED|gres/gpu=1||1\n"
      "2|u|a|gpu|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T10:01:00|00:01:00|"
      "COMPLETED|gres/gpu=1||1\n";
  TempFile f("limits.txt", two_jobs);
  ExportLimits one;
  one.max_jobs = 1;
  auto read = ReadSacctJobs(f.path(), 8, one);
  EXPECT_EQ(read.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(read.status().message(), f.path() + ":4: more than 1 jobs");  // the step did not count
  ExportLimits tiny;
  tiny.max_file_bytes = 100;
  const std::string too_big = ReadSacctJobs(f.path(), 8, tiny).status().message();
  EXPECT_NE(too_big.find("bytes, more than the 100 a job export may have"), std::string::npos) << too_big;
}

}  // namespace
}  // namespace gpupool

#include "common/status.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/value.h"

namespace gpupool {
namespace {

// ---- Status -----------------------------------------------------------------------------------

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  const Status st;
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kOk);
  EXPECT_EQ(st.message(), "");
  EXPECT_EQ(st.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
}

// Every factory sets its own code and keeps the message verbatim; none of them is OK.
TEST(StatusTest, FactoriesSetCodeAndMessage) {
  const struct {
    Status status;
    StatusCode code;
    const char* name;
  } cases[] = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {Status::NotFound("m"), StatusCode::kNotFound, "NotFound"},
      {Status::AlreadyExists("m"), StatusCode::kAlreadyExists, "AlreadyExists"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted, "ResourceExhausted"},
      {Status::Unschedulable("m"), StatusCode::kUnschedulable, "Unschedulable"},
      {Status::IoError("m"), StatusCode::kIoError, "IoError"},
      {Status::Internal("m"), StatusCode::kInternal, "Internal"},
      {Status::LimitExceeded("m"), StatusCode::kLimitExceeded, "LimitExceeded"},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(c.status.ok()) << c.name;
    EXPECT_EQ(c.status.code(), c.code) << c.name;
    EXPECT_EQ(c.status.message(), "m") << c.name;
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
}

// The format documented in status.h: "<CodeName>: <message>".
TEST(StatusTest, ToStringMatchesDocumentedFormat) {
  EXPECT_EQ(Status::InvalidArgument("gpu must be below 1 or a whole number").ToString(),
            "InvalidArgument: gpu must be below 1 or a whole number");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  const Status st = Status::NotFound("no GPU 3");
  const Status wrapped = st.WithContext("node 'n1'");
  EXPECT_EQ(wrapped.code(), StatusCode::kNotFound);
  EXPECT_EQ(wrapped.message(), "node 'n1': no GPU 3");
  // Contexts nest outermost first, and the original is untouched (WithContext returns a copy).
  EXPECT_EQ(wrapped.WithContext("job 'x'").message(), "job 'x': node 'n1': no GPU 3");
  EXPECT_EQ(st.message(), "no GPU 3");
}

// Context on success is meaningless: an OK status stays OK and gains no message.
TEST(StatusTest, WithContextOnOkStaysOk) {
  const Status wrapped = Status::Ok().WithContext("anything");
  EXPECT_TRUE(wrapped.ok());
  EXPECT_EQ(wrapped.message(), "");
}

// ---- Result -----------------------------------------------------------------------------------

TEST(ResultTest, HoldsValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  *r = 7;  // mutable access through operator*
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsError) {
  const Result<int> r = Status::ResourceExhausted("no room");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(), "no room");
}

TEST(ResultTest, ArrowAndConstAccess) {
  const Result<std::string> r = std::string("hello");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 5u);
  EXPECT_EQ(*r, "hello");
}

// A move-only value can be moved out of an rvalue Result.
TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

// ---- RETURN_IF_ERROR / ASSIGN_OR_RETURN --------------------------------------------------------

int g_evaluations = 0;

Status CountedStatus(Status st) {
  ++g_evaluations;
  return st;
}

// Returns `after` when `first` is OK, so the caller can tell whether execution continued.
Status ReturnIfErrorHelper(Status first, Status after) {
  RETURN_IF_ERROR(CountedStatus(std::move(first)));
  return after;
}

TEST(MacroTest, ReturnIfErrorReturnsTheErrorAndEvaluatesOnce) {
  g_evaluations = 0;
  const Status st = ReturnIfErrorHelper(Status::IoError("disk"), Status::Internal("not reached"));
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message(), "disk");
  EXPECT_EQ(g_evaluations, 1);
}

TEST(MacroTest, ReturnIfErrorContinuesOnOk) {
  g_evaluations = 0;
  const Status st = ReturnIfErrorHelper(Status::Ok(), Status::AlreadyExists("continued"));
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(g_evaluations, 1);
}

// The macro is one statement: it works as the body of an unbraced if/else.
Status ReturnIfErrorInIf(bool check, Status st) {
  if (check)
    RETURN_IF_ERROR(st);
  else
    return Status::Internal("else branch");
  return Status::Ok();
}

TEST(MacroTest, ReturnIfErrorIsASingleStatement) {
  EXPECT_EQ(ReturnIfErrorInIf(true, Status::NotFound("x")).code(), StatusCode::kNotFound);
  EXPECT_TRUE(ReturnIfErrorInIf(true, Status::Ok()).ok());
  EXPECT_EQ(ReturnIfErrorInIf(false, Status::Ok()).code(), StatusCode::kInternal);
}

Result<int> MaybeInt(bool ok, int v) {
  if (!ok) return Status::InvalidArgument("no int");
  return v;
}

// Two ASSIGN_OR_RETURNs in one function (distinct temporaries via __LINE__), into a new variable
// and into an existing one.
Result<int> SumOfTwo(bool first_ok, bool second_ok) {
  ASSIGN_OR_RETURN(int a, MaybeInt(first_ok, 40));
  int b = 0;
  ASSIGN_OR_RETURN(b, MaybeInt(second_ok, 2));
  return a + b;
}

TEST(MacroTest, AssignOrReturnAssignsOnSuccess) {
  const Result<int> r = SumOfTwo(true, true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 42);
}

TEST(MacroTest, AssignOrReturnPropagatesTheFirstError) {
  const Result<int> r1 = SumOfTwo(false, true);
  EXPECT_EQ(r1.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r1.status().message(), "no int");
  const Result<int> r2 = SumOfTwo(true, false);
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidArgument);
}

Result<std::unique_ptr<int>> MakeBox(int v) {
  return std::make_unique<int>(v);
}

Result<int> UnboxPlusOne(int v) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));
  return *box + 1;
}

// The macro moves the value out, so move-only types work.
TEST(MacroTest, AssignOrReturnWithMoveOnlyType) {
  const Result<int> r = UnboxPlusOne(9);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 10);
}

// A Status-returning function may use ASSIGN_OR_RETURN too (the error converts to Status).
Status CheckPositive(bool ok) {
  ASSIGN_OR_RETURN(int v, MaybeInt(ok, 3));
  return v > 0 ? Status::Ok() : Status::Internal("negative");
}

TEST(MacroTest, AssignOrReturnInStatusFunction) {
  EXPECT_TRUE(CheckPositive(true).ok());
  EXPECT_EQ(CheckPositive(false).code(), StatusCode::kInvalidArgument);
}

// ---- Value (plugin arguments; its typed reads return Result) ----------------------------------

TEST(ValueTest, DefaultIsNullAndSetTurnsItIntoAMap) {
  Value v;
  EXPECT_TRUE(v.is_null());
  EXPECT_EQ(v.TypeName(), "null");
  EXPECT_EQ(v.Find("a"), nullptr);  // not a map: nothing to find
  v.Set("a", 1);
  EXPECT_TRUE(v.is_map());
  ASSERT_NE(v.Find("a"), nullptr);
  EXPECT_EQ(*v.Find("a")->AsInt("a"), 1);
}

// Map members keep insertion order; setting an existing key replaces it in place.
TEST(ValueTest, MapKeepsInsertionOrderAndReplaces) {
  Value v;
  v.Set("b", 1);
  v.Set("a", 2);
  v.Set("b", "three");
  const Value::Map* m = v.AsMap();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].first, "b");
  EXPECT_EQ((*m)[1].first, "a");
  EXPECT_EQ(*(*m)[0].second.AsString("b"), "three");
}

TEST(ValueTest, TypeNames) {
  EXPECT_EQ(Value(true).TypeName(), "bool");
  EXPECT_EQ(Value(3).TypeName(), "integer");
  EXPECT_EQ(Value(int64_t{3}).TypeName(), "integer");
  EXPECT_EQ(Value(1.5).TypeName(), "number");
  EXPECT_EQ(Value("s").TypeName(), "string");
  EXPECT_EQ(Value(Value::List{1, 2}).TypeName(), "list");
  EXPECT_EQ(Value(Value::Map{}).TypeName(), "map");
}

// AsInt accepts integral doubles (YAML may give 4.0) but not fractions; the error names the value
// and the type found.
TEST(ValueTest, AsIntAcceptsIntegralDoublesOnly) {
  EXPECT_EQ(*Value(7).AsInt("x"), 7);
  EXPECT_EQ(*Value(4.0).AsInt("x"), 4);
  const Result<int64_t> frac = Value(3.5).AsInt("fgd.typicalPods[3].cpu");
  ASSERT_FALSE(frac.ok());
  EXPECT_EQ(frac.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(frac.status().message(), "fgd.typicalPods[3].cpu must be an integer, got number");
  EXPECT_FALSE(Value("7").AsInt("x").ok());
}

TEST(ValueTest, TypedReads) {
  EXPECT_DOUBLE_EQ(*Value(2).AsDouble("x"), 2.0);  // ints widen to double
  EXPECT_DOUBLE_EQ(*Value(0.25).AsDouble("x"), 0.25);
  EXPECT_FALSE(Value("0.25").AsDouble("x").ok());
  EXPECT_EQ(*Value(true).AsBool("x"), true);
  const Result<bool> b = Value(1).AsBool("flag");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "flag must be true or false, got integer");
  EXPECT_EQ(*Value("s").AsString("x"), "s");
  EXPECT_FALSE(Value(1).AsString("x").ok());
  const Value list(Value::List{1, "a"});
  ASSERT_NE(list.AsList(), nullptr);
  EXPECT_EQ(list.AsList()->size(), 2u);
  EXPECT_EQ(list.AsMap(), nullptr);
}

}  // namespace
}  // namespace gpupool

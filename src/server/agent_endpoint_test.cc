// The agent endpoint rule, alone: what a node may name as the place the server reads its logs.
#include "server/agent_endpoint.h"

#include <gtest/gtest.h>

#include "client/api_client.h"

namespace gpupool {
namespace {

TEST(AgentEndpoint, AgentsOnRealAddressesAndNamesAreAccepted) {
  for (const char* e : {"http://10.0.0.7:9400", "https://node-3.gpu.example:9400", "http://[2001:db8::7]:9400",
                        "http://127.0.0.1:1", "http://[::1]:65535", "https://[::ffff:10.0.0.7]:9400"})
    EXPECT_TRUE(CheckAgentEndpoint(e).ok()) << e << ": " << CheckAgentEndpoint(e).ToString();
}

TEST(AgentEndpoint, WhatNoAgentServesOnIsRefusedNamingTheField) {
  for (const char* e :
       {"http://169.254.169.254:80", "http://0.0.0.0:9400", "http://[::]:9400", "http://[fe80::1]:9400",
        "http://224.0.0.1:9400", "http://255.255.255.255:9400", "http://[::ffff:169.254.169.254]:80",
        "http://[ff02::1]:9400", "ftp://10.0.0.7:21", "http://10.0.0.7", "http://10.0.0.7:0",
        "http://10.0.0.7:65536", "http://10.0.0.7:94x", "http://[10.0.0.7]:9400", "http://[::1:9400",
        "http://999.1.1.1:9400", "http://a b:9400", "http://user@host:9400", "http://host/path:9400",
        "http://fe80::1:9400", "http://:9400", ""}) {
    const Status st = CheckAgentEndpoint(e);
    EXPECT_FALSE(st.ok()) << e;
    EXPECT_NE(st.message().find("agent.endpoint"), std::string::npos) << st.message();
  }
  EXPECT_FALSE(CheckAgentEndpoint("http://" + std::string(300, 'a') + ":80").ok());
}

// The registration check and the log reads' connect-time check are one rule.
TEST(AgentEndpoint, TheRuleIsTheClientsPeerRule) {
  for (const char* a : {"169.254.169.254", "0.0.0.0", "::", "fe80::1", "224.0.0.1", "255.255.255.255",
                        "::ffff:169.254.169.254", "ff02::1"})
    EXPECT_TRUE(IsNonPeerAddress(a)) << a;
  for (const char* a : {"10.0.0.7", "127.0.0.1", "::1", "2001:db8::7", "node-3", "", "999.1.1.1"})
    EXPECT_FALSE(IsNonPeerAddress(a)) << a;
}

TEST(AgentEndpoint, TheAgentMemberIsCheckedWhole) {
  const nlohmann::json good = {{"endpoint", "http://10.0.0.7:9400"}, {"logToken", std::string(32, 'a')}};
  ASSERT_TRUE(ParseAgentInfo(good).ok());
  EXPECT_EQ(ParseAgentInfo(good)->endpoint, "http://10.0.0.7:9400");
  nlohmann::json extra = good;
  extra["password"] = "x";
  EXPECT_NE(ParseAgentInfo(extra).status().message().find("agent.password: unknown field"), std::string::npos);
  nlohmann::json short_token = good;
  short_token["logToken"] = "abc";
  EXPECT_NE(ParseAgentInfo(short_token).status().message().find("agent.logToken"), std::string::npos);
  nlohmann::json not_hex = good;
  not_hex["logToken"] = std::string(32, 'z');
  EXPECT_FALSE(ParseAgentInfo(not_hex).ok());
  EXPECT_FALSE(ParseAgentInfo(nlohmann::json::array()).ok());
  nlohmann::json number = good;
  number["endpoint"] = 7;
  EXPECT_NE(ParseAgentInfo(number).status().message().find("agent.endpoint: must be a string"), std::string::npos);
}

}  // namespace
}  // namespace gpupool

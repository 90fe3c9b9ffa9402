// The digest and comparison that every authenticated request goes through.
#include "server/node_credentials.h"

#include <gtest/gtest.h>

#include <string>

namespace gpupool {
namespace {

TEST(NodeCredentialHashing, Sha256HexMatchesTheStandardVectors) {
  // FIPS 180-2 examples, and the empty string.
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Bytes that are not text hash like any others.
  EXPECT_EQ(Sha256Hex(std::string("\0\xff", 2)).size(), 64u);
}

TEST(NodeCredentialHashing, ConstantTimeEqualComparesContentsAndLengths) {
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_TRUE(ConstantTimeEqual("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEqual("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEqual("secret", "secret "));
  EXPECT_FALSE(ConstantTimeEqual("", "x"));
}

}  // namespace
}  // namespace gpupool

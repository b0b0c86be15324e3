// The JSON reader the JSONL datasets use (ggml_rp/core/json.h): escapes, \u with surrogate pairs,
// numbers, literals, nesting, and errors that give the byte offset.
#include "ggml_rp/core/json.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using rp::json::Value;

Value parse(const std::string & s) { return rp::json::parse(s, "src"); }

std::string error_of(const std::string & s) {
    try {
        parse(s);
    } catch (const rp::Error & e) {
        return e.what();
    }
    ADD_FAILURE() << "no error for " << s;
    return "";
}

TEST(Json, StringEscapes) {
    EXPECT_EQ(parse(R"("a\"b\\c\/d\be\ff\ng\rh\ti")").string, "a\"b\\c/d\be\ff\ng\rh\ti");
    EXPECT_EQ(parse(R"("\u0041\u00e9\u20AC")").string, "A\xC3\xA9\xE2\x82\xAC");        // A, e acute, euro
    EXPECT_EQ(parse(R"("\uD83D\uDE00!")").string, "\xF0\x9F\x98\x80!");                // U+1F600 from a pair
    EXPECT_EQ(parse(R"("\u0000")").string, std::string(1, '\0'));
    EXPECT_EQ(parse("\"caf\xC3\xA9\"").string, "caf\xC3\xA9");                          // raw UTF-8 kept
}

TEST(Json, NumbersLiteralsNesting) {
    EXPECT_EQ(parse("-0").number, 0.0);
    EXPECT_EQ(parse("1.5e3").number, 1500.0);
    EXPECT_EQ(parse("12E-1").number, 1.2);
    EXPECT_TRUE(parse("true").boolean);
    EXPECT_FALSE(parse(" false ").boolean);
    EXPECT_EQ(parse("null").type, Value::Type::Null);
    const Value v = parse(R"( {"a": [1, {"b": "c"}, []], "d": {}, "a2": null} )");
    ASSERT_TRUE(v.is_object());
    ASSERT_EQ(v.object.size(), 3u);
    const Value * a = v.find("a");
    ASSERT_TRUE(a && a->is_array());
    EXPECT_EQ(a->array[1].find("b")->string, "c");
    EXPECT_TRUE(a->array[2].array.empty());
    EXPECT_EQ(v.find("zz"), nullptr);
}

TEST(Json, ErrorsGiveTheOffset) {
    EXPECT_EQ(error_of(R"({"a" 1})"), "src: invalid JSON at byte offset 5: expected ':'");
    EXPECT_NE(error_of(R"({"a": 1} x)").find("byte offset 9: unexpected text after"), std::string::npos);
    EXPECT_NE(error_of(R"("abc)").find("unterminated string"), std::string::npos);
    EXPECT_NE(error_of("\"a\nb\"").find("byte offset 2: control character"), std::string::npos);
    EXPECT_NE(error_of(R"("\x")").find("invalid escape"), std::string::npos);
    EXPECT_NE(error_of(R"("\uD83D")").find("unpaired surrogate"), std::string::npos);
    EXPECT_NE(error_of(R"("\uDE00")").find("unpaired low surrogate"), std::string::npos);
    EXPECT_NE(error_of(R"("\uD83D\u0041")").find("invalid low surrogate"), std::string::npos);
    EXPECT_NE(error_of(R"("\u12G4")").find("invalid hex digit"), std::string::npos);
    for (const char * bad : {"01", "1.", ".5", "+1", "-", "1e", "tru", "nul", "[1,]", "{\"a\":1,}", "", "[1 2]"}) {
        EXPECT_NE(error_of(bad).find("invalid JSON at byte offset"), std::string::npos) << bad;
    }
    EXPECT_NE(error_of(std::string(100, '[')).find("nesting deeper than 64"), std::string::npos);
}

} // namespace

// dump writes what parse reads back to the same value, on one line, numbers in their shortest exact form.
TEST(Json, DumpRoundTrips) {
    const std::string text = R"({"a": [1, 2.5, -0.1, 1e+300, true, null], "b": {"c": "q\"\n\u0001"}, "d": 123456789012})";
    const Value v = rp::json::parse(text, "t");
    const std::string d = rp::json::dump(v);
    EXPECT_EQ(d, R"({"a": [1, 2.5, -0.1, 1e+300, true, null], "b": {"c": "q\"\n\u0001"}, "d": 123456789012})");
    EXPECT_EQ(rp::json::dump(rp::json::parse(d, "t")), d);
    EXPECT_EQ(rp::json::dump(rp::json::parse("0.30000000000000004", "t")), "0.30000000000000004");
}

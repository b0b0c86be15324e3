// The Jinja interpreter (models/jinja): statements, expressions, filters, tests and methods on small
// templates whose output is known (what Jinja and llama.cpp's engine print), whitespace control, and the
// errors: unsupported constructs and bad templates name the construct and the line, raise_exception
// carries the template's message, nothing aborts.
#include "models/text/jinja/jinja.h"

#include "base/error.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using rp::jinja::Value;

std::string render(const std::string & src, Value vars = Value::object()) {
    std::tm now{};
    now.tm_year = 124;
    now.tm_mon = 1;
    now.tm_mday = 29;
    return rp::jinja::Template(src).render(vars, now);
}

std::string error_of(const std::string & src) {
    try {
        render(src);
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

TEST(Jinja, OutputAndLiterals) {
    EXPECT_EQ(render("a{{ 1 + 2 }}b{{ 'x' ~ 'y' }}{{ \"q\\n\" }}"), "a3bxyq\n");
    EXPECT_EQ(render("{{ 7 / 2 }} {{ 7 % 3 }} {{ 2 * 3 }} {{ -1 }} {{ 1.5 }} {{ 'ab' * 2 }}"), "3.5 1 6 -1 1.5 abab");
    EXPECT_EQ(render("{{ true }} {{ none }}|{{ undefined_name }}|{{ [1, 'a'] }}"), "True ||1a");
    EXPECT_EQ(render("{{ 'a' 'b' }}"), "ab");
    EXPECT_EQ(render("{{ 'x' if false else 'y' }}{{ 'z' if true }}"), "yz");
}

TEST(Jinja, WhitespaceControl) {
    // trim_blocks / lstrip_blocks as llama.cpp uses them, and the - markers
    EXPECT_EQ(render("x\n  {% if true %}\nA\n  {% endif %}\ny"), "x\nA\ny");
    EXPECT_EQ(render("x  {{- ' a ' -}}  y"), "x a y");
    EXPECT_EQ(render("x\n{# comment #}\ny"), "x\ny");
    EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");  // no trim after a plain }}
    EXPECT_EQ(render("a\n"), "a");               // one trailing newline is dropped
    EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(Jinja, ForLoops) {
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{% if loop.first %}F{% endif %}"
                     "{% if loop.last %}L{% endif %}{{ loop.length }};{% endfor %}"),
              "103F3;2123;321L3;");
    EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
    EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"), "a=1,b=2,");
    EXPECT_EQ(render("{% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %}"), "a1");
    EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"), "2242");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "1");
    EXPECT_EQ(render("{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"), "-2;1-;");
    EXPECT_EQ(render("{% for x in undefined_name %}x{% endfor %}ok"), "ok");
}

TEST(Jinja, SetNamespaceMacroCall) {
    EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");  // loop scope
    EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "3");
    EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
    EXPECT_EQ(render("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]"), "[in1]");
    EXPECT_EQ(render("{% macro m(a, b='d') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"), "<1d><12>");
    EXPECT_EQ(render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}body{% endcall %}"), "[body]");
    EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(Jinja, FiltersAndMethods) {
    EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'hello world' | capitalize }}|{{ 'a-b' | replace('-', '+') }}"),
              "a b|ABab|Hello world|a+b");
    EXPECT_EQ(render("{{ [1, 2, 3] | length }}{{ 'abc' | length }}{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [1, 2] | join('-') }}"),
              "3312" "1-2");
    EXPECT_EQ(render("{{ x | default('d') }}{{ '' | default('e', true) }}{{ '5' | int + 1 }}{{ 3 | string }}"), "de63");
    EXPECT_EQ(render("{{ [{'a': 1}, {'a': 2}, {'b': 3}] | selectattr('a', 'defined') | map(attribute='a') | list }}"), "12");
    EXPECT_EQ(render("{{ [1, 2, 3] | reject('equalto', 2) | list }}{{ [3, 1, 2] | sort | join }}{{ [1, 1, 2] | unique | join }}"),
              "13" "123" "12");
    EXPECT_EQ(render("{{ 'a,b,c'.split(',')[-1] }}{{ 'a,b,c'.rsplit(',', 1)[0] }}{{ '\\nx\\n'.strip('\\n') }}{{ 'xa'.lstrip('x') }}"),
              "ca,bxa");
    EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('b') }}{{ 'abc'.find('c') }}{{ 'abc'.upper() }}"), "TrueFalse2ABC");
    EXPECT_EQ(render("{{ 'abcdef'[::-1] }}{{ 'abcdef'[1:3] }}{{ [1, 2, 3][1:] | join }}{{ [1, 2, 3][::-1] | join }}{{ [1, 2, 3][-1] }}"),
              "fedcbabc23" "321" "3");
    EXPECT_EQ(render("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 9) }}{{ {'b': 1, 'a': 2}.keys() | join }}"), "19ba");
}

TEST(Jinja, ToJson) {
    EXPECT_EQ(render("{{ {'a': [1, 'x\"y', none, true], 'b': {}} | tojson }}"), "{\"a\": [1, \"x\\\"y\", null, true], \"b\": {}}");
    EXPECT_EQ(render("{{ {'a': [1, 2]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
    EXPECT_EQ(render("{{ 'caf\xc3\xa9 \xf0\x9f\x98\x80' | tojson }}"), "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");  // ensure_ascii off
    EXPECT_EQ(render("{{ 'caf\xc3\xa9 \xf0\x9f\x98\x80' | tojson(ensure_ascii=true) }}"), "\"caf\\u00e9 \\ud83d\\ude00\"");
    EXPECT_EQ(render("{{ [1, 2] | tojson(separators=[',', ':']) }}"), "[1,2]");
}

TEST(Jinja, Tests) {
    EXPECT_EQ(render("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
                     "{{ 'a' is sequence }}{{ 1 is number }}{{ true is true }}{{ 0 is false }}{{ 3 is odd }}"),
              "FalseTrueTrueTrueTrueTrueTrueTrueFalseTrue");
    EXPECT_EQ(render("{{ 'a' in 'abc' }}{{ 2 not in [1, 2] }}{{ 'k' in {'k': 1} }}{{ x is not defined }}"), "TrueFalseTrueTrue");
}

TEST(Jinja, GlobalsAndDate) {
    EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "29 Feb 2024");
    EXPECT_EQ(render("{{ range(3) | join }}{{ range(1, 7, 2) | join }}"), "012135");
    Value vars = Value::object();
    vars.obj().set("messages", Value::array({Value::string("m")}));
    EXPECT_EQ(render("{{ messages[0] }}{{ messages | length }}", vars), "m1");
}

// What llama.cpp's engine does where Jinja2 would raise or our engine used to refuse (the bundle's templates rely
// on it): integer dict keys (ByteDance-Seed-OSS: iterated in order by dictsort, compared as integers, found only by
// an integer subscript), the filters of an undefined value or of none (unsloth's Apriel: `tools | length` with tools
// undefined; functionary: `none | selectattr(...)`), and str.format with {} placeholders (tencent-Hy3).
TEST(Jinja, LlamaCppLenience) {
    EXPECT_EQ(render("{% set d = {512: 'b', 0: 'a', 16384: 'c'} %}{% for k, v in d | dictsort %}{{ k + 1 }}{{ v }},{% endfor %}"
                     "{{ d[512] }}|{{ d['512'] }}|{{ 0 in d }}{{ '0' in d }}|{% for k in d %}{{ k > 100 }}{% endfor %}"),
              "1a,513b,16385c,b||TrueFalse|TrueFalseTrue");
    EXPECT_EQ(error_of("{{ {1: 'a', 'b': 2} }}").find("both string and integer keys") != std::string::npos, true);
    EXPECT_EQ(render("{{ undefined_name | length }}|{{ undefined_name | list | length }}|{{ undefined_name | join(',') }}|"
                     "{{ undefined_name | selectattr('type', 'equalto', 'x') | list | length }}|{{ undefined_name | upper }}|"
                     "{{ none | selectattr('type', 'equalto', 'x') | list | length }}|{{ none | string }}|{{ none | map(attribute='a') | list }}"),
              "0|0||0||0|None|");
    EXPECT_EQ(render("{{ '<{}|{}>'.format('a', 2) }}{{ 'plain'.format() }}"), "<a|2>plain");
    EXPECT_NE(error_of("{{ '{0}'.format(1) }}").find("'{}' placeholders"), std::string::npos);
}

TEST(Jinja, Errors) {
    // the construct and the line / column are named; never a silent rendering
    EXPECT_NE(error_of("a\n{% include 'x' %}").find("line 2, column 4: unsupported statement '{% include %}'"), std::string::npos)
        << error_of("a\n{% include 'x' %}");
    EXPECT_NE(error_of("\n\n{{ x | frobnicate }}").find("line 3"), std::string::npos);
    EXPECT_NE(error_of("{{ x | frobnicate }}").find("unsupported filter 'frobnicate'"), std::string::npos);
    EXPECT_NE(error_of("{{ x is frob }}").find("unsupported test 'frob'"), std::string::npos);
    EXPECT_NE(error_of("{{ 2 ** 3 }}").find("unsupported operator '**'"), std::string::npos);
    EXPECT_NE(error_of("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
    EXPECT_NE(error_of("{% if x %}no end").find("missing {% endif %}"), std::string::npos);
    EXPECT_NE(error_of("{{ 'open").find("line 1, column 4: unterminated string"), std::string::npos);
    EXPECT_NE(error_of("{{ 'a\\q' }}").find("unsupported escape"), std::string::npos);
    EXPECT_NE(error_of("{# no end").find("unterminated comment"), std::string::npos);
    EXPECT_NE(error_of("{{ 1 + }}").find("expected an expression"), std::string::npos);
    EXPECT_NE(error_of("{{ 1 - 'a' }}").find("unsupported operator '-'"), std::string::npos);
    EXPECT_NE(error_of("{{ x.y() }}").find("cannot call undefined"), std::string::npos);
    EXPECT_EQ(error_of("{{ raise_exception('Only user and assistant roles!') }}"),
              "chat template raised an exception: Only user and assistant roles!");
    EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion"), std::string::npos);
}

} // namespace

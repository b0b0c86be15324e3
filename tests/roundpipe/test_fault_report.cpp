// FaultReport (roundpipe/fault_report.h): a program's own error may follow from a fault upstream (an upload that
// failed left its buffer unwritten), so the first error of any other actor is reported before it, whatever the
// order they were recorded in; a program's error alone is reported as it is.
#include "ggml_rp/roundpipe/fault_report.h"

#include <gtest/gtest.h>

#include <string>

namespace {

std::string reported(const rp::FaultReport & f) {
    try {
        f.rethrow();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(FaultReport, AStreamFaultIsReportedBeforeTheProgramErrorsThatFollowedIt) {
    rp::FaultReport none;
    EXPECT_FALSE(none.failed());
    EXPECT_EQ(reported(none), "");

    rp::FaultReport f;
    f.record("GET_ROWS: id 1025895457 is outside the table's 512 rows", rp::FaultReport::Origin::Program);
    EXPECT_TRUE(f.failed());
    EXPECT_EQ(reported(f), "pipeline: GET_ROWS: id 1025895457 is outside the table's 512 rows");  // alone: as it is
    f.record("cpu:0: cpu:0 stream 1: injected fault: copy #300 failed");
    f.record("cpu:1: a later fault");
    f.record("another program error", rp::FaultReport::Origin::Program);
    EXPECT_EQ(reported(f), "pipeline: cpu:0: cpu:0 stream 1: injected fault: copy #300 failed");
}

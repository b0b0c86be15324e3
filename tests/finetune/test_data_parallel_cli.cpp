// What rp-finetune says about data parallelism in every build: without MPI, --dp and an mpirun launch are
// refused with the way to get it (the ASan build of CI is configured without MPI); with MPI, --dp outside
// mpirun is refused. Nothing is written either way. (tests/mpi runs the real thing under mpirun.)
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace {

using ft_test::run;
using ft_test::stories;
using ft_test::tool;

std::string job(const rp_test::TempDir & dir) {
    return tool("rp-finetune") + " -m " + stories() + " --data " + ft_test::model_path("reference/train.txt") +
           " --seq-len 32 --batch 4 --micro-batches 4 --steps 2 -t 1 -o " + dir.file("a.gguf");
}

bool nothing_written(const rp_test::TempDir & dir) { return std::filesystem::is_empty(dir.path); }

TEST(DataParallelCli, DpWithoutAnMpiLaunchIsRefused) {
    rp_test::TempDir dir;
    std::string log;
    EXPECT_EQ(run(job(dir) + " --dp", &log), 1);
#ifdef RP_TESTS_HAVE_MPI
    EXPECT_NE(log.find("error: --dp: this process was not launched by mpirun"), std::string::npos) << log;
#else
    EXPECT_NE(log.find("error: --dp needs a build with MPI (apt-get install libopenmpi-dev openmpi-bin"), std::string::npos) << log;
#endif
    EXPECT_TRUE(nothing_written(dir));
    EXPECT_EQ(run(job(dir) + " --dp-link 25Gbit/s,10us", &log), 1);
    EXPECT_NE(log.find("--dp-link and --inject-dp-fault need a data-parallel run"), std::string::npos) << log;
    EXPECT_TRUE(nothing_written(dir));
}

#ifndef RP_TESTS_HAVE_MPI
// mpirun -np 2 of a build without MPI: two copies would each train alone and write the same files.
TEST(DataParallelCli, AnMpirunLaunchOfABuildWithoutMpiIsRefused) {
    rp_test::TempDir dir;
    std::string log;
    EXPECT_EQ(run("OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 " + job(dir), &log), 1);
    EXPECT_NE(log.find("launched by mpirun with 2 ranks, but this rp-finetune was built without MPI"), std::string::npos) << log;
    EXPECT_TRUE(nothing_written(dir));
}
#endif

TEST(DataParallelCli, GroupedReferenceOptionsAreChecked) {
    rp_test::TempDir dir;
    std::string log;
    EXPECT_EQ(run(job(dir) + " --dp-groups 5", &log), 1);
    EXPECT_NE(log.find("--dp-groups 5 must be in [1, --micro-batches = 4]"), std::string::npos) << log;
    EXPECT_EQ(run(job(dir) + " --dp-groups 2 --devices 2", &log), 1);
    EXPECT_NE(log.find("--dp-groups runs on the host"), std::string::npos) << log;
    EXPECT_TRUE(nothing_written(dir));
    // one group is the plain run, bit for bit
    ASSERT_EQ(run(job(dir) + " --dp-groups 1", &log), 0) << log;
}

} // namespace

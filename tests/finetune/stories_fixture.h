// stories260K with its tokenizer and the reference text as 32-token sequences: the session and run-loop
// tests' shared input (loaded once per process).
#pragma once

#include "models/data/dataset.h"
#include "models/arch/model.h"
#include "models/text/tokenizer.h"
#include "tests/finetune/ft_test_util.h"

#include <memory>

namespace ft_test {

struct StoriesFixture {
    std::unique_ptr<rp::Model> model = rp::Model::load(stories());
    rp::Tokenizer tok{model->file()};
    rp::Dataset data = [&] {
        rp::DatasetOptions o;
        o.seq_len = 32;
        o.n_ctx = model->hparams().n_ctx_train;
        return rp::Dataset::load(shared_dir() + "/models/reference/train.txt", tok, o);
    }();
    static StoriesFixture & get() {
        static StoriesFixture f;
        return f;
    }
};

} // namespace ft_test

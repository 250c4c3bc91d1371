# The committed demo tokenizer (models/demo) is exactly what tools/make_demo_tokenizer.cpp makes.
add_test(NAME demo_tokenizer_reproducible
         COMMAND make_demo_tokenizer --check ${CMAKE_SOURCE_DIR}/tests/data/tokenizer/tok_bench.txt
                 ${CMAKE_SOURCE_DIR}/models/demo)
set_tests_properties(demo_tokenizer_reproducible PROPERTIES LABELS cpu)

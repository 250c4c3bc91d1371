# tools/check_layers.py: the layering check over src/'s includes (docs/architecture.md); its own
# tests (check_layers_test.py) plant violations in temporary trees and expect it to fail. And the
# tests of tools/nsys_steps.py and bench/peers/llama_bench.sh.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME check_layers COMMAND Python3::Interpreter ${CMAKE_SOURCE_DIR}/tools/check_layers.py
                                     ${CMAKE_SOURCE_DIR}/src)
  add_test(NAME check_layers_test
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/check_layers_test.py)
  # tools/nsys_steps.py (a decode step's per-kernel exposed time from an Nsight Systems export)
  # on small exports built by the test.
  add_test(NAME nsys_steps_test
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/nsys_steps_test.py)
  # bench/peers/llama_bench.sh (the single-stream protocol on llama.cpp's llama-bench) against a
  # stand-in llama-bench.
  add_test(NAME llama_bench_driver_test
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/llama_bench_test.py)
  set_tests_properties(check_layers check_layers_test nsys_steps_test llama_bench_driver_test
                       PROPERTIES LABELS cpu)
else()
  add_test(NAME check_layers COMMAND ${CMAKE_COMMAND} -E echo
           "check_layers needs python3 (not found at configure time)")
  set_tests_properties(check_layers PROPERTIES WILL_FAIL TRUE LABELS cpu)
endif()

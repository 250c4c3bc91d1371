# Cross-check of the Jinja engine against @huggingface/jinja (npm): tests/jinja/crosscheck.mjs
# renders seeded random chats with both Qwen chat templates through @huggingface/jinja and
# `lilac render`. The node package is installed with `npm ci` (package-lock.json pins it) into
# the build tree, never into the sources. CI has node and npm: without them the test fails.
set(LILAC_JINJA_XCHECK_DIR ${CMAKE_BINARY_DIR}/jinja-crosscheck)
foreach(f package.json package-lock.json crosscheck.mjs)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${f} ${LILAC_JINJA_XCHECK_DIR}/${f} COPYONLY)
endforeach()
find_program(LILAC_NPM npm)
find_program(LILAC_NODE node)
if(LILAC_NPM AND LILAC_NODE)
  add_test(NAME jinja_npm_ci COMMAND ${LILAC_NPM} ci --no-audit --no-fund
           WORKING_DIRECTORY ${LILAC_JINJA_XCHECK_DIR})
  set_tests_properties(jinja_npm_ci PROPERTIES FIXTURES_SETUP jinja_node LABELS cpu)
  add_test(NAME jinja_crosscheck
           COMMAND ${LILAC_NODE} crosscheck.mjs --lilac $<TARGET_FILE:lilac>
                   --data ${CMAKE_SOURCE_DIR}/tests/data/tokenizer --cases 250
           WORKING_DIRECTORY ${LILAC_JINJA_XCHECK_DIR})
  set_tests_properties(jinja_crosscheck PROPERTIES FIXTURES_REQUIRED jinja_node LABELS cpu)
else()
  add_test(NAME jinja_crosscheck COMMAND ${CMAKE_COMMAND} -E echo
           "jinja_crosscheck needs node and npm (not found at configure time)")
  set_tests_properties(jinja_crosscheck PROPERTIES WILL_FAIL TRUE LABELS cpu)
endif()

# End-to-end tests with real clients (node): tests/clients/run.sh installs the locked npm
# packages when needed and runs `node --test` against the freshly built test build of the server
# (lilac_test_server: lilac plus the test-only `serve --scripted FILE`, tests/support).
find_program(LILAC_NODE node)
find_program(LILAC_NPM npm)
if(LILAC_NODE AND LILAC_NPM)
  add_test(NAME clients_node COMMAND ${CMAKE_SOURCE_DIR}/tests/clients/run.sh $<TARGET_FILE:lilac_test_server>)
  set_tests_properties(clients_node PROPERTIES LABELS cpu TIMEOUT 900 RUN_SERIAL TRUE)
else()
  message(WARNING "node/npm not found: the client tests (tests/clients) are not registered")
endif()

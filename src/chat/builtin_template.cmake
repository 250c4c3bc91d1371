# Embeds the Qwen3.6 chat template into lilac_core: tests/data/tokenizer/chat_template_qwen36.jinja
# is the one copy (the tests render the same file), turned into a generated .cpp at configure time.
# Editing the .jinja re-runs the configure step.
set(LILAC_BUILTIN_TEMPLATE_FILE ${CMAKE_SOURCE_DIR}/tests/data/tokenizer/chat_template_qwen36.jinja)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${LILAC_BUILTIN_TEMPLATE_FILE})
file(READ ${LILAC_BUILTIN_TEMPLATE_FILE} LILAC_BUILTIN_TEMPLATE_TEXT)
string(FIND "${LILAC_BUILTIN_TEMPLATE_TEXT}" ")lilac_template\"" LILAC_DELIM_AT)
if(NOT LILAC_DELIM_AT EQUAL -1)
  message(FATAL_ERROR "${LILAC_BUILTIN_TEMPLATE_FILE} contains the raw-string delimiter; change it in src/chat/builtin_template.cpp.in")
endif()
configure_file(${CMAKE_SOURCE_DIR}/src/chat/builtin_template.cpp.in
               ${CMAKE_BINARY_DIR}/generated/builtin_template.cpp @ONLY)
target_sources(lilac_core PRIVATE ${CMAKE_BINARY_DIR}/generated/builtin_template.cpp)

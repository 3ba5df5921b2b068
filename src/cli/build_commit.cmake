# Run at every build (src/CMakeLists.txt, target qkmla_build_commit): writes OUT with the source
# tree's `git describe` when that differs from what OUT holds, so that a binary names the commit it
# was built from, and provenance.cpp recompiles only when the commit changes.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(commit "")
endif()
set(text "#define QKMLA_BUILD_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()

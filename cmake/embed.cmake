# Embeds a file in the binary as a byte array: cmake -DINPUT=file -DOUTPUT=file.cpp -DNAME=symbol -P embed.cmake
# writes  namespace qkv::cli { extern const unsigned char NAME[] = {...}; extern const size_t NAME_size... }
# (the explorer page is served from the binary: nothing to install beside it, nothing fetched).
foreach(var INPUT OUTPUT NAME)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed: -D${var}=... is required")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} by cmake/embed.cmake: do not edit.\n#include <cstddef>\n"
     "namespace qkv::cli {\nextern const unsigned char ${NAME}[] = {${bytes}0};\n"
     "extern const size_t ${NAME}Size = ${size};\n}  // namespace qkv::cli\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")

# Sourced by the scripts that carry binaries to a machine without their libraries
# (gpu_check.sh, compare_elsewhere.sh).
#
# stage_libraries STAGE [SEARCH_PATH]: copies into STAGE/lib every shared library that the
# binaries in STAGE/bin and the libraries in STAGE/lib load (found through SEARCH_PATH, then
# STAGE/lib), except glibc's own and the NVIDIA driver's, which the other machine has; keeps
# what STAGE/lib already holds; strips debug sections (the device tool carries 64 MiB); fails
# naming the binary if one still misses a library.
stage_libraries() {
  local stage=$1 search=${2:+$2:} file library
  for file in "$stage"/bin/* "$stage"/lib/*; do
    [ -e "$file" ] || continue  # an empty lib/ at first
    LD_LIBRARY_PATH=$search$stage/lib ldd "$file" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
  done | sort -u | while read -r library; do
    case $(basename "$library") in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libresolv.so.*) ;;
      libcuda.so.*|libnvidia-*) ;;
      *) [ -e "$stage/lib/$(basename "$library")" ] || cp -L "$library" "$stage/lib/" ;;
    esac
  done
  strip --strip-debug "$stage"/bin/* "$stage"/lib/*
  for file in "$stage"/bin/*; do
    if LD_LIBRARY_PATH=$stage/lib ldd "$file" | grep -q "not found"; then
      echo "$file: a library is missing from the stage" >&2
      return 1
    fi
  done
}

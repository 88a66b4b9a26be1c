# Included after each project() call of the llama-cpp-python build (CMAKE_PROJECT_INCLUDE, from
# scripts/setup.sh). llama-cpp-python forces LLAMA_BUILD_COMMON on in its cache for the
# multimodal library, which this build leaves out (LLAVA_BUILD=OFF), and its Python package
# never loads libllama-common. That library was about half of the compile (219 of 459 s on
# 2 cores). A normal variable shadows the cache entry in the scopes below (CMP0126), so the
# common directory is not added and neither built nor installed.
set(LLAMA_BUILD_COMMON OFF)

// The target that builds the tests' precompiled header (test_pch.h); test executables reuse it.
int main() { return 0; }

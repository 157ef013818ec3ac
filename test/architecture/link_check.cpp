// The main of the link-check executables (CMakeLists.txt, stratagem_part): each links one part
// whole with only the parts layers.py allows it, so that a call across a wrong arrow is an
// undefined reference at build time. They are never run.
int main() {
  return 0;
}

#include "render/plot.hpp"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace qkmla {

namespace {
std::string quoted(const std::string& s) {  // a gnuplot single-quoted string
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}
// A POSIX shell single-quoted word: the path reaches gnuplot as it is, whatever it holds.
std::string shell_quoted(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}
}  // namespace

std::string write_svg(const Plot& p, const std::string& svg) {
  const std::string data = svg + ".dat", script = svg + ".gp";
  {
    std::ofstream d(data);
    for (const PlotSeries& s : p.series) {
      d << "# " << s.name << "\n";
      for (const auto& [x, y] : s.points)
        d << fmt::format("{:.17g} {:.17g}\n", x, y > 0 || !p.log_y ? y : 1e-300);
      d << "\n\n";
    }
    d.close();
    if (!d) {  // the folder is missing or not writable: say so, not "gnuplot failed"
      const std::string why = std::strerror(errno);
      std::remove(data.c_str());
      return "cannot write beside it (" + data + ": " + why + ")";
    }
  }
  std::ofstream g(script);
  g << fmt::format("set terminal svg size {},{} dynamic background rgb 'white' noenhanced\n",
                   p.width, p.height)
    << "set output " << quoted(svg) << "\n"
    << "set title " << quoted(p.title) << "\nset xlabel " << quoted(p.xlabel) << "\nset ylabel "
    << quoted(p.ylabel) << "\n"
    << (p.log_y ? "set logscale y 10\nset format y '%.0e'\n" : "")
    << (p.log_x ? "set logscale x 2\n" : "") << "set key below maxrows 4 noenhanced\nset grid\n";
  if (!p.xtics.empty()) {
    g << "set xtics (";
    for (size_t i = 0; i < p.xtics.size(); ++i)
      g << (i ? ", " : "") << quoted(p.xtics[i]) << " " << i;
    g << ") rotate by -30\nset xrange [-0.5:" << p.xtics.size() - 0.5 << "]\n";
  }
  g << "plot ";
  for (size_t i = 0; i < p.series.size(); ++i)
    g << (i ? ", " : "") << quoted(data) << " index " << i << " with linespoints"
      << (p.series[i].dashed ? " dashtype 2" : "") << " title " << quoted(p.series[i].name);
  g << "\n";
  g.close();
  const int rc = std::system(("gnuplot " + shell_quoted(script) + " 2>/dev/null").c_str());
  std::remove(data.c_str());
  std::remove(script.c_str());
  if (rc == 0) return "";
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
    return "gnuplot is missing (install it: apt-get install gnuplot-nox)";
  return "gnuplot failed to draw it";
}

}  // namespace qkmla

// The run's figures for Prometheus (--metrics-port) and `tpc plot` (issue 8).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "runtime/metrics_server.h"
#include "test_support.h"

namespace tpc {
namespace {

std::string httpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace

TEST_CASE("metrics: the latest figures in Prometheus text format at /metrics", "[metrics]") {
  auto server = MetricsServer::start(0);
  REQUIRE(server.ok());
  (*server)->publish({{"loss", 3.25}, {"step", 7}});
  (*server)->publish({{"loss", 3.0}});
  std::string reply = httpGet((*server)->port(), "/metrics");
  CHECK(reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(reply.find("# TYPE tpc_loss gauge\ntpc_loss 3\n") != std::string::npos);
  CHECK(reply.find("tpc_step 7\n") != std::string::npos);
  CHECK(httpGet((*server)->port(), "/other").rfind("HTTP/1.1 404", 0) == 0);
  // Prometheus' spellings of the non-finite values (a C++ stream's nan and inf fail its parser).
  (*server)->publish({{"valid_loss", -std::nan("")}, {"valid_ppl", HUGE_VAL}, {"lowest", -HUGE_VAL}});
  reply = httpGet((*server)->port(), "/metrics");
  CHECK(reply.find("tpc_valid_loss NaN\n") != std::string::npos);
  CHECK(reply.find("tpc_valid_ppl +Inf\n") != std::string::npos);
  CHECK(reply.find("tpc_lowest -Inf\n") != std::string::npos);
  // A port in use is one clear error.
  auto again = MetricsServer::start((*server)->port());
  REQUIRE(!again.ok());
  CHECK(again.error().find("cannot listen") != std::string::npos);
  CHECK(again.error().find("(another process is using the port; pick another)") != std::string::npos);
}

TEST_CASE("plot: loss, validation loss and tokens/s of one or more logs as SVG", "[plot][cli]") {
  test::TempDir dir;
  test::writeFile(dir / "a.jsonl",
                  "{\"step\": 1, \"loss\": 5.5, \"lr\": 1e-4, \"grad_norm\": 2, \"tokens_per_s\": 900, \"elapsed_s\": 1}\n"
                  "{\"step\": 10, \"valid_loss\": 4.9, \"valid_ppl\": 134}\n"
                  "{\"step\": 10, \"loss\": 4.5, \"lr\": 1e-4, \"grad_norm\": 2, \"tokens_per_s\": 1000, \"elapsed_s\": 2}\n"
                  "{\"step\": 20, \"loss\": 3.5, \"lr\": 1e-4, \"grad_norm\": 2, \"tokens_per_s\": 1100, \"elapsed_s\": 3}\n");
  test::writeFile(dir / "b.jsonl", "{\"step\": 1, \"loss\": 5.4}\n{\"step\": 20, \"loss\": 3.9}\n");
  auto r = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " " + (dir / "b.jsonl") + " -o " +
                            (dir / "c.svg"));
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  std::string svg = test::readFile(dir / "c.svg");
  CHECK(svg.rfind("<svg xmlns='http://www.w3.org/2000/svg'", 0) == 0);
  CHECK(svg.find("a.jsonl loss") != std::string::npos);
  CHECK(svg.find("a.jsonl valid loss") != std::string::npos);
  CHECK(svg.find("b.jsonl loss") != std::string::npos);
  CHECK(svg.find(">tokens/s</text>") != std::string::npos);
  size_t lines = 0;
  for (size_t k = 0; (k = svg.find("<polyline", k)) != std::string::npos; ++k) ++lines;
  CHECK(lines == 5);  // 3 loss curves, 2 throughput curves
  // A log with steps 2 and 3 twice (a resumed run of older tpc appended them again): one point a step, in step
  // order, the later line's value.
  test::writeFile(dir / "twice.jsonl",
                  "{\"step\": 1, \"loss\": 5}\n{\"step\": 2, \"loss\": 4}\n{\"step\": 3, \"loss\": 3}\n"
                  "{\"step\": 2, \"loss\": 4.5}\n{\"step\": 3, \"loss\": 3.5}\n{\"step\": 4, \"loss\": 3}\n");
  REQUIRE(test::runCommand(test::tpcBinary() + " plot " + (dir / "twice.jsonl") + " -o " + (dir / "t.svg")).exitCode == 0);
  {
    const std::string t = test::readFile(dir / "t.svg");
    const size_t at = t.find("points='", t.find("<polyline"));
    REQUIRE(at != std::string::npos);
    std::istringstream pts(t.substr(at + 8, t.find('\'', at + 8) - at - 8));
    std::vector<double> xs, ys;
    for (std::string xy; pts >> xy;) {
      xs.push_back(std::stod(xy.substr(0, xy.find(','))));
      ys.push_back(std::stod(xy.substr(xy.find(',') + 1)));
    }
    REQUIRE(xs.size() == 4);
    CHECK(std::is_sorted(xs.begin(), xs.end()));
    // y is linear in the loss: step 2 at 4.5 (the later line; 4 was the earlier) lies a quarter of the way from
    // step 1's 5 to step 4's 3.
    CHECK((ys[1] - ys[0]) / (ys[3] - ys[0]) == Approx(0.25).margin(0.01));
  }
  test::writeFile(dir / "bad.jsonl", "{\"step\": 1, \"loss\": 5}\nnot json\n");
  auto bad = test::runCommand(test::tpcBinary() + " plot " + (dir / "bad.jsonl") + " -o " + (dir / "d.svg"));
  CHECK(bad.exitCode == 1);
  CHECK(bad.err.find("bad.jsonl:2: error: not a tpc run log line") != std::string::npos);
  // -o naming a log to plot would overwrite it.
  auto self = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " -o " + (dir / "a.jsonl"));
  CHECK(self.exitCode == 1);
  CHECK(self.err.find("is one of the logs to plot") != std::string::npos);
  CHECK(test::readFile(dir / "a.jsonl").rfind("{\"step\": 1", 0) == 0);
  auto folder = test::runCommand(test::tpcBinary() + " plot " + dir.path.string() + " -o " + (dir / "e.svg"));
  CHECK(folder.exitCode == 1);
  CHECK(folder.err.find("is a directory, not a JSONL log") != std::string::npos);
  // -o must name a file.
  auto noValue = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " -o");
  CHECK(noValue.exitCode == 1);
  CHECK(noValue.err == "tpc plot: error: option -o needs a value\n");
  auto empty = test::runCommand("cd " + dir.path.string() + " && " + test::tpcBinary() + " plot a.jsonl -o ''");
  CHECK(empty.exitCode == 1);
  CHECK(empty.err == "tpc plot: error: -o is empty; name the file to write\n");
  auto toFolder = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " -o " + dir.path.string());
  CHECK(toFolder.exitCode == 1);
  CHECK(toFolder.err == "-o " + dir.path.string() + ": error: is a directory; name a file to write, not a folder\n");
  // The file is SVG whatever it is called: another extension is refused.
  auto png = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " -o " + (dir / "c.png"));
  CHECK(png.exitCode == 1);
  CHECK(png.err == "tpc plot: error: -o " + (dir / "c.png") + ": plot writes SVG; name the file .svg (e.g. -o curves.svg)\n");
  CHECK(!std::filesystem::exists(dir / "c.png"));
  // Non-numbers are no points; values no scale spans say so instead of drawing NaN coordinates.
  test::writeFile(dir / "nan.jsonl", "{\"step\": 1, \"loss\": \"nan\"}\n{\"step\": 2, \"loss\": null}\n");
  auto nan = test::runCommand(test::tpcBinary() + " plot " + (dir / "nan.jsonl") + " -o " + (dir / "n.svg"));
  CHECK(nan.exitCode == 1);
  CHECK(nan.err == (dir / "nan.jsonl") + ": error: no line has a finite number as \"loss\"\n");
  test::writeFile(dir / "huge.jsonl", "{\"step\": 1, \"loss\": 1e308}\n{\"step\": 2, \"loss\": -1e308}\n"
                                      "{\"step\": 3, \"loss\": \"nan\"}\n");
  auto huge = test::runCommand(test::tpcBinary() + " plot " + (dir / "huge.jsonl") + " -o " + (dir / "h.svg"));
  CHECK(huge.exitCode == 0);
  const std::string hsvg = test::readFile(dir / "h.svg");
  CHECK(hsvg.find("nan") == std::string::npos);
  CHECK(hsvg.find("inf") == std::string::npos);
  CHECK(hsvg.find("(values too large to plot") != std::string::npos);
  // Steps no scale spans name the steps, not the losses (it said "values too large: 4 to 5").
  test::writeFile(dir / "far.jsonl", "{\"step\": 1e308, \"loss\": 5}\n{\"step\": -1e308, \"loss\": 4}\n");
  REQUIRE(test::runCommand(test::tpcBinary() + " plot " + (dir / "far.jsonl") + " -o " + (dir / "f.svg")).exitCode == 0);
  CHECK(test::readFile(dir / "f.svg").find("(steps too large to plot: -1e+308 to 1e+308)") != std::string::npos);
}

// The audit of the thirty-ninth session: a run's colour differed between the panels when an earlier run had a
// validation curve, and a log whose last line a running tpc had half written could not be plotted.
TEST_CASE("plot: one colour a run in both panels, and a cut-short last line is left out with a note", "[plot][cli]") {
  test::TempDir dir;
  test::writeFile(dir / "a.jsonl", "{\"step\": 2, \"loss\": 5, \"tokens_per_s\": 9}\n{\"step\": 2, \"valid_loss\": 5.1}\n"
                                   "{\"step\": 3, \"loss\": 4, \"tokens_per_s\": 9}\n");
  test::writeFile(dir / "b.jsonl", "{\"step\": 2, \"loss\": 4.5, \"tokens_per_s\": 8}\n{\"step\": 3, \"loss\": 4.2, \"to");
  auto r = test::runCommand(test::tpcBinary() + " plot " + (dir / "a.jsonl") + " " + (dir / "b.jsonl") + " -o " + (dir / "c.svg"));
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.err == "tpc plot: note: " + (dir / "b.jsonl") + ":2: the last line is cut short (a run still writing the log?); "
                 "it is left out\n");
  const std::string svg = test::readFile(dir / "c.svg");
  auto colourOf = [&](const std::string& label) {  // the legend entry's fill
    size_t at = svg.find("'>" + label + "</text>");
    REQUIRE(at != std::string::npos);
    return svg.substr(svg.rfind("fill='", at) + 6, 7);
  };
  CHECK(colourOf("a.jsonl loss") == colourOf("a.jsonl"));
  CHECK(colourOf("a.jsonl valid loss") == colourOf("a.jsonl"));
  CHECK(colourOf("b.jsonl loss") == colourOf("b.jsonl"));
  CHECK(colourOf("a.jsonl") != colourOf("b.jsonl"));
  CHECK(svg.find("stroke-dasharray") != std::string::npos);  // the validation curve
}

TEST_CASE("plot: twelve runs are told apart, logs of one name are named by path, the legend stays in its panel",
          "[plot][cli]") {
  test::TempDir dir;
  std::string args;
  for (int i = 1; i <= 12; ++i) {
    std::filesystem::create_directories(dir / ("r" + std::to_string(i)));
    const std::string log = dir / ("r" + std::to_string(i)) + "/log.jsonl";
    test::writeFile(log, "{\"step\": 1, \"loss\": " + std::to_string(5 + i) + "}\n{\"step\": 2, \"loss\": 4, \"valid_loss\": 4.5, \"tokens_per_s\": 9}\n");
    args += " " + log;
  }
  auto r = test::runCommand(test::tpcBinary() + " plot" + args + " -o " + (dir / "many.SVG"));  // the suffix in any case
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  const std::string svg = test::readFile(dir / "many.SVG");
  // A legend entry's colour and its curve's stroke pattern: run 1 and run 11 share a colour but not a pattern.
  auto style = [&](int run) {
    const std::string label = dir / ("r" + std::to_string(run)) + "/log.jsonl loss";
    size_t at = svg.find("'>" + label + "</text>");
    REQUIRE(at != std::string::npos);
    const std::string colour = svg.substr(svg.rfind("fill='", at) + 6, 7);
    const size_t line = svg.rfind("<polyline", at);  // each series' curve comes just before its legend line
    REQUIRE(line != std::string::npos);
    REQUIRE(svg.compare(line, 30 + colour.size(), "<polyline fill='none' stroke='" + colour) == 0);
    return std::vector<std::string>{colour, svg.substr(line, svg.find(" points=", line) - line)};
  };
  std::set<std::vector<std::string>> styles;
  for (int i = 1; i <= 12; ++i) styles.insert(style(i));
  CHECK(styles.size() == 12);
  CHECK(style(1)[0] == style(11)[0]);
  // 24 legend lines (loss and valid loss of each) in the loss panel, which spans x 70-690 and y 30-250; the font
  // shrinks for the long path labels to fit.
  size_t legend = 0;
  for (size_t at = svg.find(" text-anchor='end' fill="); at != std::string::npos;
       at = svg.find(" text-anchor='end' fill=", at + 1)) {
    const size_t open = svg.rfind("<text x='", at);
    const double x = std::stod(svg.substr(open + 9)), y = std::stod(svg.substr(svg.find(" y='", open) + 4));
    const double font = std::stod(svg.substr(svg.find("font-size='", open) + 11));
    const std::string label = svg.substr(svg.find('>', at) + 1, svg.find("</text>", at) - svg.find('>', at) - 1);
    if (legend < 24) {
      INFO(label << " at " << x << ", " << y << ", font " << font);
      CHECK(y < 250);
      CHECK(x - 0.6 * font * static_cast<double>(label.size()) >= 70);  // its start, roughly: inside the panel
    }
    ++legend;
  }
  CHECK(legend == 36);  // and the 12 in the tokens/s panel
}

TEST_CASE("plot: values closer than a double can tell apart or one huge value draw finite coordinates", "[plot][cli]") {
  test::TempDir dir;
  // Losses that differ in their last digit hung the tick loop (a step below the precision at 1e6); one loss or one
  // step of 1e17 divided by a range of zero (1e17 + 1 is 1e17) and drew NaN.
  for (const std::string& log : {std::string("{\"step\": 1, \"loss\": 1000000}\n{\"step\": 2, \"loss\": 1000000.0000000002}\n"),
                                  std::string("{\"step\": 1, \"loss\": 1e17}\n"),
                                  std::string("{\"step\": 1e17, \"loss\": 3, \"tokens_per_s\": 5}\n"),
                                  std::string("{\"step\": 1, \"loss\": 0}\n{\"step\": 2, \"loss\": 5e-324}\n")}) {
    INFO(log);
    test::writeFile(dir / "close.jsonl", log);
    std::filesystem::remove(dir / "close.svg");
    auto r = test::runCommand("timeout 60 " + test::tpcBinary() + " plot " + (dir / "close.jsonl") + " -o " +
                              (dir / "close.svg"));
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    const std::string svg = test::readFile(dir / "close.svg");
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);
    CHECK(svg.find("<polyline") != std::string::npos);
  }
}

TEST_CASE("plot: a log's file name is escaped in the SVG", "[plot][cli]") {
  test::TempDir dir;
  // The legend is the file name: '&', '<' and a byte that is not UTF-8 made a file no SVG viewer opens.
  const std::string name = "r&d <1> it's \xff.jsonl";
  test::writeFile(dir / name, "{\"step\": 1, \"loss\": 5}\n{\"step\": 2, \"loss\": 4}\n");
  auto r = test::runCommand(test::tpcBinary() + " plot '" + (dir / "r&d <1> it'\\''s \xff.jsonl") + "' -o " +
                            (dir / "e.svg"));
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  const std::string svg = test::readFile(dir / "e.svg");
  CHECK(svg.find(">r&amp;d &lt;1&gt; it&apos;s ?.jsonl loss</text>") != std::string::npos);
  CHECK(svg.find("r&d") == std::string::npos);
  CHECK(svg.find('\xff') == std::string::npos);
}

TEST_CASE("plot: a garbled line nested a million deep is an error naming the line", "[plot][cli]") {
  test::TempDir dir;
  // The recursive JSON parser overflowed the stack on it: a segfault, not an error.
  test::writeFile(dir / "deep.jsonl", "{\"step\": 1, \"loss\": 5}\n" + std::string(1000000, '[') + std::string(1000000, ']') + "\n");
  auto r = test::runCommand(test::tpcBinary() + " plot " + (dir / "deep.jsonl") + " -o " + (dir / "d.svg"));
  CHECK(r.exitCode == 1);
  CHECK(r.err == (dir / "deep.jsonl") + ":2: error: not a tpc run log line (a JSON object with \"step\")\n");
  CHECK_FALSE(std::filesystem::exists(dir / "d.svg"));
}

TEST_CASE("plot: tick labels are distinct on a flat loss and late steps", "[plot][cli]") {
  test::TempDir dir;
  // Four significant digits labelled the ticks of losses 10.8249 to 10.8253 "10.82", "10.83", "10.83", ... and
  // steps 100001 to 100003 all "1e+05".
  test::writeFile(dir / "flat.jsonl", "{\"step\": 100001, \"loss\": 10.8253}\n{\"step\": 100002, \"loss\": 10.8249}\n"
                                      "{\"step\": 100003, \"loss\": 10.8251}\n");
  auto r = test::runCommand(test::tpcBinary() + " plot " + (dir / "flat.jsonl") + " -o " + (dir / "f.svg"));
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  const std::string svg = test::readFile(dir / "f.svg");
  const size_t throughput = svg.find(">tokens/s</text>");
  for (const std::string anchor : {"text-anchor='end'>", "text-anchor='middle'>"}) {
    std::vector<std::string> labels;
    for (size_t k = svg.find(anchor); k < throughput; k = svg.find(anchor, k + 1)) {
      const size_t from = k + anchor.size();
      labels.push_back(svg.substr(from, svg.find('<', from) - from));
    }
    labels.erase(std::remove(labels.begin(), labels.end(), "step"), labels.end());
    INFO(anchor);
    CHECK(labels.size() >= 3);
    std::vector<std::string> sorted = labels;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    for (const std::string& l : labels) CHECK(l.find("e+") == std::string::npos);
  }
}

}  // namespace tpc

// `lilac chat`: an interactive chat in the terminal. Answers stream as they are generated, the
// reasoning shown apart (dim on a terminal, between [reasoning] markers otherwise); the
// conversation is kept (and its prompt reused by the engine) until /reset. Ctrl-C stops the
// current answer, not the program; /exit or Ctrl-D leaves.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/console.h"
#include "cli/terminal.h"
#include "util/error.h"

namespace lilac::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) {
  g_interrupted = 1;
}

const char* kHelp =
    "commands: /reset (new conversation), /exit (or Ctrl-D), /help. Ctrl-C stops the current "
    "answer.\n";

// One line from stdin; false at end of input. A Ctrl-C while waiting gives an empty line back.
bool read_line(std::string& line) {
  line.clear();
  for (;;) {
    int c = std::fgetc(stdin);
    if (c == EOF) {
      if (std::ferror(stdin) && errno == EINTR && g_interrupted) {
        std::clearerr(stdin);
        return true;  // Ctrl-C at the prompt
      }
      return !line.empty();
    }
    if (c == '\n') return true;
    line.push_back(char(c));
  }
}

int run_chat(const GenOptions& o) {
  auto m = load_for_terminal(o);
  TurnOptions t = turn_options(o, *m);
  const bool out_tty = is_tty(1), in_tty = is_tty(0);
  // SIGINT sets a flag (no SA_RESTART, so a read at the prompt returns).
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  nlohmann::json history = nlohmann::json::array();
  auto reset = [&] {
    history = nlohmann::json::array();
    if (!o.system.empty()) history.push_back({{"role", "system"}, {"content", o.system}});
  };
  reset();
  if (in_tty) std::printf("lilac chat: %s\n%s", m->choice.dir.c_str(), kHelp);
  std::string line;
  for (;;) {
    if (in_tty || out_tty) {
      std::printf(out_tty ? "\033[1m> \033[0m" : "> ");
      std::fflush(stdout);
    }
    g_interrupted = 0;
    if (!read_line(line)) break;
    if (g_interrupted) {
      std::printf("\n(Ctrl-C stops an answer; /exit or Ctrl-D leaves)\n");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      std::printf("%s", kHelp);
      continue;
    }
    if (line == "/reset") {
      reset();
      std::printf("(new conversation)\n");
      continue;
    }
    if (line[0] == '/') {
      std::printf("unknown command %s; %s", line.c_str(), kHelp);
      continue;
    }
    history.push_back({{"role", "user"}, {"content", line}});
    bool in_reasoning = false;
    auto end_reasoning = [&] {
      if (!in_reasoning) return;
      std::fputs(out_tty ? "\033[0m\n" : "\n[/reasoning]\n", stdout);
      in_reasoning = false;
    };
    TurnCallbacks cb;
    cb.reasoning = [&](const std::string& s) {
      if (o.hide_reasoning) return;
      if (!in_reasoning) std::fputs(out_tty ? "\033[2;37m" : "[reasoning]\n", stdout);
      in_reasoning = true;
      std::fputs(s.c_str(), stdout);
      std::fflush(stdout);
    };
    cb.content = [&](const std::string& s) {
      end_reasoning();
      std::fputs(s.c_str(), stdout);
      std::fflush(stdout);
    };
    TurnResult r;
    try {
      r = run_turn(*m, history, "", t, cb, &g_interrupted);
    } catch (const Error& e) {
      end_reasoning();
      history.erase(history.end() - 1);
      std::printf("\nerror: %s\n", e.what());
      continue;
    }
    end_reasoning();
    std::printf(r.interrupted ? "\n(stopped)\n" : "\n");
    std::fflush(stdout);
    nlohmann::json answer = {{"role", "assistant"}, {"content", r.content}};
    if (!r.reasoning.empty()) answer["reasoning_content"] = r.reasoning;
    history.push_back(answer);
  }
  if (in_tty) std::printf("\n");
  return 0;
}

const Command kChat{
    "chat",
    "Chat with the model in the terminal (streaming, history, /reset, Ctrl-C stops an answer)",
    [](CLI::App& app) {
      auto o = std::make_shared<GenOptions>();
      add_gen_options(app, *o);
      return Runner([o] { return run_chat(*o); });
    }};

}  // namespace
}  // namespace lilac::cli

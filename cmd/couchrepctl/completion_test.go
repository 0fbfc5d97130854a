package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"completion", shell}, &out, &errOut); code != exitOK {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errOut.String())
	}
	return out.String()
}

// TestCompletionScriptsCoverTheCommandTable: every command and every flag
// of the table is in every shell's script.
func TestCompletionScriptsCoverTheCommandTable(t *testing.T) {
	infos, global := completionModel()
	for _, shell := range completionShells {
		s := completionScript(t, shell)
		for _, c := range infos {
			for _, w := range c.words {
				if !strings.Contains(s, w) {
					t.Errorf("%s script lacks %q", shell, w)
				}
			}
			for f := range merge(global, c.flags) {
				if !strings.Contains(s, f) {
					t.Errorf("%s script lacks flag --%s of %q", shell, f, strings.Join(c.words, " "))
				}
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"completion", "tcsh"}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "bash, zsh, fish") {
		t.Fatalf("completion tcsh: exit %d: %s", code, errOut.String())
	}
}

// TestBashCompletion runs the bash script's completion function on real
// command lines.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash not found")
	}
	script := filepath.Join(t.TempDir(), "couchrepctl.bash")
	if err := os.WriteFile(script, []byte(completionScript(t, "bash")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line string // the word being completed is the last one
		want string
	}{
		{"couchrepctl jo", "job jobs"},
		{"couchrepctl job s", "show stop"},
		{"couchrepctl --node 127.0.0.1:5987 job re", "reset restart resume"},
		{"couchrepctl jobs --st", "--state"},
		{"couchrepctl jobs --state running --wa", "--watch"},
		{"couchrepctl replicate --c", "--continuous --create-target"},
		{"couchrepctl shares ", "get set"},
		{"couchrepctl completion z", "zsh"},
		{"couchrepctl --token ", ""},
		{"couchrepctl ", "completion config drain help job jobs kill nodes replicate send shares stop takeover tree undrain verify"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			words := strings.Fields(tc.line)
			if strings.HasSuffix(tc.line, " ") {
				words = append(words, "")
			}
			var quoted []string
			for _, w := range words {
				quoted = append(quoted, "'"+w+"'")
			}
			prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
				strconv.Itoa(len(words)-1) + "\n_couchrepctl\nprintf '%s\\n' \"${COMPREPLY[@]}\" | sort | tr '\\n' ' '\n"
			out, err := exec.Command(bash, "--norc", "--noprofile", "-c", prog).CombinedOutput()
			if err != nil {
				t.Fatalf("bash: %v\n%s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Fatalf("completing %q: got %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

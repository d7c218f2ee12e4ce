package preview

import (
	"math"
	"strings"
	"testing"
)

func TestNewTokenFormat(t *testing.T) {
	if bits := TokenLen * 5; bits < 128 {
		t.Fatalf("a token carries %d bits, want at least 128", bits)
	}
	seen := map[string]bool{}
	for i := 0; i < 2000; i++ {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if len(tok) != TokenLen {
			t.Fatalf("len(%q) = %d, want %d", tok, len(tok), TokenLen)
		}
		if tok != strings.ToLower(tok) || strings.ContainsAny(tok, "=-_.") {
			t.Fatalf("token %q is not lowercase unpadded base32", tok)
		}
		if err := checkLabel(tok); err != nil {
			t.Fatalf("token %q is not a DNS label: %v", tok, err)
		}
		if !validToken(tok) {
			t.Fatalf("validToken(%q) = false for a token NewToken made", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q repeated", tok)
		}
		seen[tok] = true
	}
}

// The tokens' symbols are spread evenly, as 160 random bits would be. A
// constant, a counter or a low-entropy source fails this by a wide margin.
func TestNewTokenEntropy(t *testing.T) {
	const n = 4000
	// 160 bits fill the 32 symbols exactly: each carries 5 random bits.
	const positions = TokenLen
	var counts [32]int
	perPos := make([]map[byte]bool, positions)
	for i := range perPos {
		perPos[i] = map[byte]bool{}
	}
	for i := 0; i < n; i++ {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < positions; j++ {
			counts[strings.IndexByte("abcdefghijklmnopqrstuvwxyz234567", tok[j])]++
			perPos[j][tok[j]] = true
		}
	}
	// Chi-square against uniform, 31 degrees of freedom: the 1-in-a-million
	// critical value is about 80; allow 100.
	expected := float64(n*positions) / 32
	chi := 0.0
	for _, c := range counts {
		d := float64(c) - expected
		chi += d * d / expected
	}
	if chi > 100 || math.IsNaN(chi) {
		t.Errorf("symbol distribution chi-square = %.1f, want < 100 for uniform random tokens", chi)
	}
	for j, set := range perPos {
		if len(set) != 32 {
			t.Errorf("position %d used %d of 32 symbols over %d tokens", j, len(set), n)
		}
	}
}

func TestValidToken(t *testing.T) {
	good := strings.Repeat("a", TokenLen)
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"shape of NewToken", good, true},
		{"all symbols", "abcdefghijklmnopqrstuvwxyz234567", true},
		{"empty", "", false},
		{"one short", good[1:], false},
		{"one long", good + "a", false},
		{"upper case", strings.ToUpper(good), false},
		{"digit 0", "0" + good[1:], false},
		{"digit 8", "8" + good[1:], false},
		{"hyphen", "-" + good[1:], false},
		{"padding", "=" + good[1:], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validToken(tt.in); got != tt.want {
				t.Errorf("validToken(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestTokenPrefixIsShort(t *testing.T) {
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	p := tokenPrefix(tok)
	if strings.Contains(p, tok[:5]) || !strings.HasPrefix(p, tok[:4]) {
		t.Errorf("tokenPrefix(%q) = %q, want its first 4 characters only", tok, p)
	}
}

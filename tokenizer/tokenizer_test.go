package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func TestEncodeIsDeterministicAndRoughlyOnePerWord(t *testing.T) {
	text := "The quick brown fox jumps over the lazy dog, twice.\nThen it rests."
	a, b := Encode(text), Encode(text)
	if !slices.Equal(a, b) {
		t.Fatal("not deterministic")
	}
	if len(a) < 14 || len(a) > 24 {
		t.Fatalf("%d tokens for 13 words and 4 marks: %v", len(a), a)
	}
	for _, id := range a {
		if id >= VocabSize {
			t.Fatalf("id %d out of vocabulary", id)
		}
	}
}

func TestEncodeConcatenationKeepsPrefix(t *testing.T) {
	a := "Fix the failing test in parser.go"
	b := a + "\nand run it again"
	ea, eb := Encode(a), Encode(b)
	if !slices.Equal(ea, eb[:len(ea)]) {
		t.Fatalf("prefix not kept: %v vs %v", ea, eb)
	}
}

func TestOutputWordsRoundTrip(t *testing.T) {
	var ids []uint32
	for k := 0; k < WordCount; k++ {
		ids = append(ids, Word(k))
		if k%13 == 0 {
			ids = append(ids, Period)
		}
	}
	got := Encode(Decode(ids))
	if !slices.Equal(got, ids) {
		t.Fatalf("round trip lost tokens: %d vs %d", len(got), len(ids))
	}
}

func TestLongWordsSplit(t *testing.T) {
	if n := len(Encode(" internationalization")); n != 4 {
		t.Fatalf("long word: %d pieces, want 4", n)
	}
}

func TestChatTemplateExtendsPreviousTurn(t *testing.T) {
	turn1 := []Message{{"system", "You are a coding agent."}, {"user", "List the files."}}
	p1 := EncodeChat(turn1)
	answer := []uint32{Word(1), Word(2), Period}
	turn2 := append(turn1, Message{"assistant", Decode(answer)}, Message{"tool", "main.go README.md"})
	p2 := EncodeChat(turn2)
	want := append(append(slices.Clone(p1), answer...), End)
	if !slices.Equal(p2[:len(want)], want) {
		t.Fatalf("turn 2 does not extend turn 1 + answer:\n%v\n%v", want, p2[:len(want)])
	}
	if p1[0] != System || p1[len(p1)-1] != Assistant {
		t.Fatalf("template markers missing: %v", p1)
	}
}

func TestInvalidUTF8DoesNotPanic(t *testing.T) {
	ids := Encode("ok \xff\xfe bad")
	if len(ids) == 0 {
		t.Fatal("no tokens")
	}
}

func FuzzEncode(f *testing.F) {
	f.Add("hello world")
	f.Add(" \x00\xff日本語 text")
	f.Fuzz(func(t *testing.T, s string) {
		ids := Encode(s)
		for _, id := range ids {
			if id >= VocabSize {
				t.Fatalf("id %d out of range", id)
			}
		}
		if n := Count(s); n != len(ids) {
			t.Fatalf("Count %d, Encode gave %d ids", n, len(ids))
		}
		msgs := []Message{{"user", s}, {"assistant", s}}
		for _, o := range []ChatOptions{{}, {NoGenerationPrompt: true}, {ContinueFinal: true}} {
			if n, want := CountChat(msgs, o), len(EncodeChatWith(msgs, o)); n != want {
				t.Fatalf("CountChat %d with %+v, EncodeChatWith gave %d ids", n, o, want)
			}
		}
	})
}

// BenchmarkEncode tokenizes an agent's 100K-token context.
func BenchmarkEncode(b *testing.B) {
	text := strings.Repeat("func main() { fmt.Println(\"héllo, wörld\") } // a comment bako ", 100_000/20)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Encode(text)
	}
}

// A prompt that continues a last assistant message is the prompt that
// asked for it followed by the answer so far, token for token; without
// the generation prompt it ends with the last message's end.
func TestChatTemplateContinuesAnAnswer(t *testing.T) {
	msgs := []Message{{"system", "You are a coding agent."}, {"user", "List the files."}}
	asked := EncodeChat(msgs)
	answer := []uint32{Word(7), Word(8), Word(9)}
	cont := EncodeChatWith(append(msgs, Message{"assistant", Decode(answer)}), ChatOptions{ContinueFinal: true})
	if want := append(slices.Clone(asked), answer...); !slices.Equal(cont, want) {
		t.Fatalf("continued prompt\n%v\nwant\n%v", cont, want)
	}
	if bare := EncodeChatWith(msgs, ChatOptions{NoGenerationPrompt: true}); !slices.Equal(bare, asked[:len(asked)-1]) || bare[len(bare)-1] != End {
		t.Fatalf("without the generation prompt: %v against %v", bare, asked)
	}
}

// Package tokenizer is evolve's deterministic text tokenizer. The router and
// every simulated engine use it, so that they agree on token ids and hence on
// KV block hashes without loading a real model's vocabulary.
//
// # Vocabulary (VocabSize ids)
//
//   - 0..15: special tokens: <|endoftext|>, <|system|>, <|user|>,
//     <|assistant|>, <|tool|>, <|end|> (the rest reserved).
//   - 256..511: single bytes (ASCII punctuation, whitespace and controls).
//   - 512..512+WordCount-1: the output vocabulary: pronounceable four-letter
//     pseudo-words (" bako") that simulated engines generate. They decode to
//     text and encode back to the same id, so that an answer appended to the
//     next prompt reuses the KV blocks it was generated into.
//   - the rest: every other piece of text, by XXH3 hash of the piece.
//
// # Pre-tokenization
//
// Text is cut into pieces: an optional single leading space followed by a
// run of letters and digits (cut every MaxPieceRunes runes, as BPE splits
// long words), or any other single character. A piece that spells an output
// word maps to that word's id; an ASCII character alone maps to its byte id;
// any other piece maps to its hash id. Encoding is pure and stable across
// releases: changing it changes every block hash.
//
// # Chat template
//
// EncodeChat renders each message as <|role|> content <|end|> and appends
// <|assistant|> to ask for the answer, so the prompt of turn N+1 extends the
// prompt of turn N plus its answer token for token. EncodeChatWith can
// leave the generation prompt out, or continue a last assistant message
// (no <|end|> after it), as vLLM's add_generation_prompt and
// continue_final_message do: a prompt so continuing an answer is the
// prompt that asked for it followed by the answer's tokens.
package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// Vocabulary layout.
const (
	VocabSize     = 1 << 17 // ids are in [0, VocabSize)
	firstByteID   = 256
	firstWordID   = 512
	WordCount     = 4096 // size of the output vocabulary
	firstHashID   = firstWordID + WordCount
	MaxPieceRunes = 6 // longest run of letters in one piece
)

// FirstHashID is the first id of the hashed pieces: the ids below it are
// special tokens, bytes and output words.
const FirstHashID = firstHashID

// Special token ids.
const (
	EndOfText uint32 = 0
	System    uint32 = 1
	User      uint32 = 2
	Assistant uint32 = 3
	Tool      uint32 = 4
	End       uint32 = 5
)

var specialText = map[uint32]string{
	EndOfText: "<|endoftext|>", System: "<|system|>", User: "<|user|>",
	Assistant: "<|assistant|>", Tool: "<|tool|>", End: "<|end|>",
}

// hashSeed is fixed so that ids never change ("tokens" in ASCII).
const hashSeed uint64 = 0x746f6b656e73

const (
	consonants = "bdfghklmnprstvwz" // 16
	vowels     = "aeiou"
)

// Encode returns the token ids of text.
func Encode(text string) []uint32 {
	return AppendEncode(nil, text)
}

// AppendEncode appends the token ids of text to dst.
func AppendEncode(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		end := pieceEnd(text, i)
		dst = append(dst, pieceID(text[i:end]))
		i = end
	}
	return dst
}

// Count is len(Encode(text)), without the ids: what a prompt that may be
// too long costs before it is refused.
func Count(text string) int {
	n := 0
	for i := 0; i < len(text); i = pieceEnd(text, i) {
		n++
	}
	return n
}

// pieceEnd is where the piece of text that starts at i ends (see the
// package comment's pre-tokenization).
func pieceEnd(text string, i int) int {
	if text[i] == ' ' && i+1 < len(text) {
		if r, _ := utf8.DecodeRuneInString(text[i+1:]); isWordRune(r) {
			i++
		}
	}
	r, size := utf8.DecodeRuneInString(text[i:])
	if !isWordRune(r) {
		return i + size
	}
	for n := 0; i < len(text) && n < MaxPieceRunes; n++ {
		r, size := utf8.DecodeRuneInString(text[i:])
		if !isWordRune(r) {
			break
		}
		i += size
	}
	return i
}

func isWordRune(r rune) bool {
	return r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

func pieceID(p string) uint32 {
	if len(p) == 1 && p[0] < 0x80 {
		return firstByteID + uint32(p[0])
	}
	if id, ok := wordID(p); ok {
		return id
	}
	return firstHashID + uint32(xxh3.HashStringSeed(p, hashSeed)%uint64(VocabSize-firstHashID))
}

// wordID recognises " " + consonant vowel consonant vowel, the spelling of
// an output word, and returns its id.
func wordID(p string) (uint32, bool) {
	if len(p) != 5 || p[0] != ' ' {
		return 0, false
	}
	c1 := strings.IndexByte(consonants, p[1])
	v1 := strings.IndexByte(vowels, p[2])
	c2 := strings.IndexByte(consonants, p[3])
	v2 := strings.IndexByte(vowels, p[4])
	if c1 < 0 || v1 < 0 || c2 < 0 || v2 < 0 || v1 > 3 || v2 > 3 {
		return 0, false
	}
	k := ((c1*4+v1)*16+c2)*4 + v2
	return firstWordID + uint32(k), true
}

// Word returns the output-vocabulary token k (0 <= k < WordCount).
func Word(k int) uint32 { return firstWordID + uint32(k%WordCount) }

// Period is the token of ".", which simulated engines put between phrases.
const Period = firstByteID + '.'

// Decode returns the text of ids. Output words, bytes and special tokens
// decode exactly; a hashed prompt piece cannot be inverted and decodes as
// "<?>".
func Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(TokenText(id))
	}
	return b.String()
}

// TokenText returns the text of one token (see Decode).
func TokenText(id uint32) string {
	switch {
	case id < firstByteID:
		if s, ok := specialText[id]; ok {
			return s
		}
		return ""
	case id < firstWordID:
		return string(rune(id - firstByteID))
	case id < firstHashID:
		k := int(id - firstWordID)
		v2, k := k%4, k/4
		c2, k := k%16, k/16
		v1, c1 := k%4, k/4
		return string([]byte{' ', consonants[c1], vowels[v1], consonants[c2], vowels[v2]})
	}
	return "<?>"
}

// Message is one chat message for EncodeChat.
type Message struct {
	Role    string
	Content string
}

// RoleToken maps a chat role to its special token; unknown roles are user
// messages.
func RoleToken(role string) uint32 {
	switch role {
	case "system", "developer":
		return System
	case "assistant":
		return Assistant
	case "tool", "function":
		return Tool
	}
	return User
}

// EncodeChat renders messages with the chat template (see the package
// comment) and returns the prompt's token ids.
func EncodeChat(msgs []Message) []uint32 { return EncodeChatWith(msgs, ChatOptions{}) }

// ChatOptions change how EncodeChatWith renders, as vLLM's chat request
// fields of the same names do.
type ChatOptions struct {
	NoGenerationPrompt bool // add_generation_prompt false: no <|assistant|> at the end
	// ContinueFinal (continue_final_message) leaves the last message open,
	// without <|end|>, for the answer to go on from it; no generation
	// prompt follows.
	ContinueFinal bool
}

// EncodeChatWith is EncodeChat with options.
func EncodeChatWith(msgs []Message, o ChatOptions) []uint32 {
	var ids []uint32
	for i, m := range msgs {
		ids = append(ids, RoleToken(m.Role))
		ids = AppendEncode(ids, m.Content)
		if o.ContinueFinal && i == len(msgs)-1 {
			return ids
		}
		ids = append(ids, End)
	}
	if o.NoGenerationPrompt {
		return ids
	}
	return append(ids, Assistant)
}

// CountChat is len(EncodeChatWith(msgs, o)), without the ids.
func CountChat(msgs []Message, o ChatOptions) int {
	n := 0
	for _, m := range msgs {
		n += 2 + Count(m.Content) // role, content, end
	}
	if o.ContinueFinal && len(msgs) > 0 {
		return n - 1 // the last message is left open
	}
	if !o.NoGenerationPrompt {
		n++
	}
	return n
}

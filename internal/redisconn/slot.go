package redisconn

import "strings"

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// Slot is the Redis Cluster hash slot of key, as the cluster computes it:
// CRC16 (XMODEM) of the key's hash tag, modulo 16384. The hash tag is what
// lies between the first '{' and the first '}' after it, if that is not
// empty; otherwise the whole key is hashed. Keys sharing a tag share a slot,
// which is what lets one script touch them all on a cluster.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return SlotHash(0).Add(key).Slot()
}

// SlotHash is the slot hash of hash tag content fed to it piece by piece,
// for a search through many tags that share a head: the hash of the head is
// computed once and each candidate adds only its tail. SlotHash(0) is the
// hash of nothing; SlotHash(0).Add(tag).Slot() is the slot of every key
// tagged {tag}, for non-empty tag content free of braces.
type SlotHash uint16

// Add returns the hash extended by s.
func (h SlotHash) Add(s string) SlotHash {
	for i := 0; i < len(s); i++ {
		h = h.AddByte(s[i])
	}
	return h
}

// AddByte returns the hash extended by one byte.
func (h SlotHash) AddByte(c byte) SlotHash {
	return h<<8 ^ crc16Table[byte(h>>8)^c]
}

// Slot is the slot of the content hashed so far.
func (h SlotHash) Slot() int { return int(h % SlotCount) }

// crc16Table makes SlotHash CRC-16/XMODEM (polynomial 0x1021, initial value
// 0, no reflection), the checksum Redis Cluster hashes keys with: entry b is
// the CRC of byte b. It is derived from the polynomial once at start-up and
// only read after that.
var crc16Table = func() (t [256]SlotHash) {
	for b := range t {
		crc := SlotHash(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()
